"""``fed-auc coordinator``, ``fed-auc node`` and ``fed-auc certs``: arguments and checks."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tomllib
from pathlib import Path
from typing import Any


def add_parsers(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("coordinator", help="run an experiment over Flower (starts the SuperLink)")
    c.add_argument("--config", type=Path, help="experiment TOML with [flower]")
    c.add_argument(
        "--resume",
        metavar="RUN_ID",
        help="continue an interrupted run from its last recorded round (its recorded options)",
    )
    c.add_argument("--rounds", type=int, help="override the config's rounds")
    c.add_argument("--runs-dir", help="override the config's runs_dir (with --resume: runs)")
    c.add_argument("--json", action="store_true", help="print the JSON summary on stdout")

    n = sub.add_parser("node", help="serve one hospital site to a coordinator over Flower")
    n.add_argument("--site", type=Path, required=True, help="site TOML with a [node] table")
    n.add_argument("--coordinator", required=True, help="HOST:PORT of the coordinator")
    n.add_argument("--root-certificates", type=Path, help="the federation's CA (ca.pem)")
    n.add_argument("--auth-key", type=Path, help="this site's private key (keys/<site>.key)")
    n.add_argument("--insecure", action="store_true", help="no TLS, no key (loopback tests)")

    k = sub.add_parser("certs", help="make a pilot CA, server certificate and site keys")
    k.add_argument("--out", type=Path, default=Path("certs"), help="output folder (certs)")
    k.add_argument("--site", action="append", required=True, help="site name (repeatable)")
    k.add_argument("--host", action="append", default=[], help="coordinator DNS name or IP")


def load_experiment(path: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """The simulate options plus a ``[flower]`` table, validated before anything starts."""
    from fed_auc.simulation import SimulationConfig
    from fed_auc.transport.flower.server import FlowerSettings

    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SystemExit(f"fed-auc coordinator: cannot read config {path}: {exc}") from None
    flower = data.pop("flower", None)
    if not isinstance(flower, dict):
        raise SystemExit(f"fed-auc coordinator: config {path}: missing [flower] table")
    fields = {f.name for f in dataclasses.fields(SimulationConfig)}
    flower_fields = {f.name for f in dataclasses.fields(FlowerSettings)}
    for table, keys, valid in (("", data, fields), ("[flower] ", flower, flower_fields)):
        unknown = sorted(set(keys) - valid)
        if unknown:
            raise SystemExit(
                f"fed-auc coordinator: config {path}: unknown {table}key(s) {unknown}; "
                f"valid: {sorted(valid)}"
            )
    data.update({k: v for k, v in overrides.items() if v is not None})
    if flower.get("certs_dir") is not None:  # relative to the config file
        flower["certs_dir"] = str((path.parent / flower["certs_dir"]).resolve())
    try:
        config = SimulationConfig(**data)
        settings = FlowerSettings(**flower)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"fed-auc coordinator: config {path}: {exc}") from None
    unsupported = [k for k in ("partial_training", "personalize", "warmup_rounds") if data.get(k)]
    if unsupported or config.data != "synthetic":
        what = unsupported or [f"data = {config.data!r}"]
        raise SystemExit(
            f"fed-auc coordinator: config {path}: {what} not supported over Flower yet "
            "(nodes train the site TOML's synthetic data on the whole model); use fed-auc simulate"
        )
    config.runs_dir = str(Path(config.runs_dir).resolve())
    return {"simulation": config.to_dict(), "flower": dataclasses.asdict(settings)}


def load_resumed(runs_dir: Path, run_id: str) -> dict[str, Any]:
    """The recorded experiment of an interrupted Flower run, to continue it."""
    from fed_auc.simulation import recorded_config
    from fed_auc.store import STORE_FILE, RunStore

    if not (runs_dir / STORE_FILE).is_file():
        raise SystemExit(f"fed-auc coordinator --resume: no run store in {runs_dir}")
    with RunStore(runs_dir) as store:
        try:
            run = store.run(run_id)
        except KeyError as exc:
            raise SystemExit(f"fed-auc coordinator --resume: {exc.args[0]}") from None
    record = dict(run["config"])
    if record.pop("transport", None) != "flower":
        raise SystemExit(
            f"fed-auc coordinator --resume: run {run_id!r} did not run over Flower; "
            "continue it with `fed-auc simulate --resume`"
        )
    if run["status"] == "completed":
        raise SystemExit(f"fed-auc coordinator --resume: run {run_id!r} already completed")
    flower = record.pop("flower")
    config = recorded_config(record, runs_dir.resolve())
    return {"simulation": config.to_dict(), "flower": flower, "resume": run_id}


def coordinator(args: argparse.Namespace) -> dict[str, Any]:
    from fed_auc.transport.flower.launch import run_coordinator

    if (args.config is None) == (args.resume is None):
        raise SystemExit("fed-auc coordinator: give --config (a new run) or --resume RUN_ID")
    if args.resume is not None:
        if args.rounds is not None:
            raise SystemExit("fed-auc coordinator --resume uses the run's recorded rounds")
        experiment = load_resumed(Path(args.runs_dir or "runs"), args.resume)
    else:
        overrides = {"rounds": args.rounds, "runs_dir": args.runs_dir}
        experiment = load_experiment(args.config, overrides)
    work_dir = Path(experiment["simulation"]["runs_dir"]) / "flower"
    echo = (lambda line: print(line, file=sys.stderr)) if args.json else print
    summary = run_coordinator(experiment, work_dir, echo)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"run {summary['run_id']} completed; final pooled AUC {summary['global_auc'][-1]}")
    return summary


def node(args: argparse.Namespace) -> int:
    from fed_auc.transport.flower.launch import run_node
    from fed_auc.transport.flower.worker import SiteConfig

    if not args.insecure and (args.root_certificates is None or args.auth_key is None):
        raise SystemExit(
            "fed-auc node: give --root-certificates (the CA) and --auth-key (the site key), "
            "or --insecure for a loopback test"
        )
    for option in ("root_certificates", "auth_key"):
        path = getattr(args, option)
        if path is not None and not path.is_file():
            raise SystemExit(f"fed-auc node: --{option.replace('_', '-')} {path}: no such file")
    try:
        site = SiteConfig.from_toml(args.site)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"fed-auc node: {exc}") from None
    return run_node(site, args.coordinator, args.root_certificates, args.auth_key)


def certs(args: argparse.Namespace) -> None:
    from fed_auc.transport.flower.certs import make_certs

    out = make_certs(args.out, args.site, args.host)
    print(f"CA, server certificate and keys for {args.site} in {out}")
