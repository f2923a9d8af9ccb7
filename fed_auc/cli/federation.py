"""``fed-auc coordinator``, ``fed-auc node`` and ``fed-auc certs``: arguments and checks."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fed_auc.cli.experiment_options import add_compute_arguments
from fed_auc.cli.option_flags import add_option_flags
from fed_auc.experiment.files import load_experiment, load_resumed


def add_parsers(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "coordinator",
        help="run an experiment over Flower (starts the SuperLink)",
        description="The experiment's options come from --config; the option flags given here "
        "override the file's.",
    )
    c.add_argument("--config", type=Path, help="experiment TOML with [flower]")
    c.add_argument(
        "--resume",
        metavar="RUN_ID",
        help="continue an interrupted run from its last recorded round (its recorded options)",
    )
    add_option_flags(
        c,
        ("rounds", "runs_dir", "hold_out", "init"),
        helps={"runs_dir": "where the run store and the run folders live (with --resume: runs)",
               "init": "the starting weights the coordinator broadcasts (a registered model "
               "folder or a DenseNet state_dict; nodes never read the file)"},
    )  # fmt: skip
    c.add_argument(
        "--address",
        help="override [flower] address, HOST:PORT the SuperLink listens on "
        "(0.0.0.0:9092 to accept nodes from other machines)",
    )
    c.add_argument(
        "--leave-each-out",
        action="store_true",
        help="external validation of every site: one run with all sites, then one per site "
        "without it, on the same nodes; each site's held-out AUC beside its in-federation AUC",
    )
    c.add_argument("--json", action="store_true", help="print the JSON summary on stdout")

    n = sub.add_parser(
        "node",
        help="serve one hospital site to a coordinator over Flower "
        "(fed-auc node approve --site FILE DIGEST: approve an experiment)",
    )
    n.add_argument("action", nargs="?", choices=["approve"], help="approve an experiment")
    n.add_argument("digest", nargs="?", help="with approve: the experiment digest it printed")
    n.add_argument("--site", type=Path, required=True, help="the site file (hospitals/README.md)")
    n.add_argument("--coordinator", help="HOST:PORT of the coordinator")
    n.add_argument(
        "--check",
        action="store_true",
        help="validate the site file and its images and labels, print the data card, exit",
    )
    n.add_argument(
        "--strict",
        action="store_true",
        help="refuse (exit non-zero) when the data check warns: constant or saturated images",
    )
    n.add_argument(
        "--image-size", type=int, default=28, help="image side for --check and the start check"
    )
    n.add_argument(
        "--num-labels", type=int, default=1, help="labels of a synthetic site, for --check"
    )
    add_compute_arguments(n, "this node; wins over its site file's [node] device")
    n.add_argument("--root-certificates", type=Path, help="the federation's CA (ca.pem)")
    n.add_argument("--auth-key", type=Path, help="this site's private key (keys/<site>.key)")
    n.add_argument("--insecure", action="store_true", help="no TLS, no key (loopback tests)")

    k = sub.add_parser("certs", help="make a pilot CA, server certificate and site keys")
    k.add_argument("--out", type=Path, default=Path("certs"), help="output folder (certs)")
    k.add_argument("--site", action="append", required=True, help="site name (repeatable)")
    k.add_argument("--host", action="append", default=[], help="coordinator DNS name or IP")


def check_init(options: dict[str, Any]) -> None:
    """Read and map the config's ``init`` before the run exists: a refused file records
    nothing (the sites' labels are checked once they register)."""
    if options.get("init") is None:
        return
    from fed_auc.experiment.config import ExperimentConfig
    from fed_auc.run.initial import starting_point

    try:
        config = ExperimentConfig(**options)
        starting_point(config, config.num_labels, None)
    except ValueError as exc:
        raise SystemExit(f"fed-auc coordinator: {exc}") from None


def coordinator(args: argparse.Namespace) -> dict[str, Any]:
    require_flower("coordinator")
    from fed_auc.transport.flower.launch import run_coordinator

    if (args.config is None) == (args.resume is None):
        raise SystemExit("fed-auc coordinator: give --config (a new run) or --resume RUN_ID")
    leave_each_out = getattr(args, "leave_each_out", False)
    if leave_each_out and (args.hold_out or args.resume is not None):
        raise SystemExit(
            "fed-auc coordinator: --leave-each-out chooses the held-out sites itself and starts "
            "new runs: drop --hold-out and --resume"
        )
    if args.resume is not None:
        if args.rounds is not None or args.init is not None:
            raise SystemExit("fed-auc coordinator --resume uses the run's recorded rounds and init")
        experiment = load_resumed(Path(args.runs_dir or "runs"), args.resume)
    else:
        overrides = {"rounds": args.rounds, "runs_dir": args.runs_dir, "address": args.address,
                     "hold_out": args.hold_out, "init": args.init}  # fmt: skip
        experiment = load_experiment(args.config, overrides)
        check_init(experiment["experiment"])
        if leave_each_out:
            experiment["leave_each_out"] = True
    work_dir = Path(experiment["experiment"]["runs_dir"]) / "flower"
    echo = (lambda line: print(line, file=sys.stderr)) if args.json else print
    summary = run_coordinator(experiment, work_dir, echo)
    if args.json:
        print(json.dumps(summary, indent=2))
    elif leave_each_out:
        from fed_auc.cli.simulate import print_leave_each_out

        print_leave_each_out(summary["leave_each_out"])
    else:
        from fed_auc.run.headline import summary_headline

        print(f"run {summary['run_id']} completed: {summary_headline(summary)}")
    return summary


def node(args: argparse.Namespace) -> int:
    """Check the site file and its data; with ``--check`` print the data card and stop, else
    serve the site until stopped."""
    from fed_auc.site import SiteDefinition, check_site_data

    if getattr(args, "action", None) == "approve":
        return approve(args)
    try:
        site = SiteDefinition.from_toml(args.site).with_compute(args.device, args.precision)
        compute = site.compute()  # a device this machine lacks stops the node here
        if not args.check:  # a coordinator its policy does not name is never contacted, and
            _check_coordinator(site, args.site, args.coordinator)  # a second node on this
            lock = _lock_state_dir(site)  # state directory is refused at once
        data = site.load(args.image_size, args.num_labels)
        check_site_data(site, data)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"fed-auc node: {exc}") from None
    from fed_auc.data.cards import card_warnings, data_card, render_data_card

    warnings = card_warnings(data)
    if args.check:
        print(render_data_card(data_card(data)))
    for line in warnings:
        print(f"fed-auc node: warning: {args.site}: {line}", file=sys.stderr)
    if warnings and getattr(args, "strict", False):
        raise SystemExit(
            f"fed-auc node --strict: {args.site}: refused, the data check found "
            f"{len(warnings)} problem(s): " + "; ".join(warnings)
        )
    if args.check:
        state = f"ready with {len(warnings)} warning(s)" if warnings else "ready"
        print(f"fed-auc node --check: computes on {compute.device} in {compute.precision}")
        print(f"fed-auc node --check: {args.site} is {state} ({len(data.train)} training images)")
        return 0
    if args.coordinator is None:
        raise SystemExit("fed-auc node: give --coordinator HOST:PORT (or --check)")
    if not args.insecure and (args.root_certificates is None or args.auth_key is None):
        raise SystemExit(
            "fed-auc node: give --root-certificates (the CA) and --auth-key (the site key), "
            "or --insecure for a loopback test"
        )
    for option in ("root_certificates", "auth_key"):
        path = getattr(args, option)
        if path is not None and not path.is_file():
            raise SystemExit(f"fed-auc node: --{option.replace('_', '-')} {path}: no such file")
    require_flower("node")
    from fed_auc.transport.flower.launch import run_node
    from fed_auc.transport.flower.node_watch import unlock_state_dir

    try:
        return run_node(site, args.coordinator, args.root_certificates, args.auth_key)
    finally:
        unlock_state_dir(lock)


def _check_coordinator(site, site_file: Path, coordinator: str | None) -> None:
    """``[policy] coordinators``: the addresses this node may connect to."""
    accepted = site.policy.coordinators
    if coordinator is not None and accepted is not None and coordinator not in accepted:
        raise SystemExit(
            f"fed-auc node: {site_file}: [policy] coordinators: {coordinator} is not one "
            f"of {list(accepted)}; the node connects to none other"
        )


def approve(args: argparse.Namespace) -> int:
    """``fed-auc node approve --site FILE DIGEST``: the node trains that experiment from its
    next request on (a running node need not restart); without DIGEST: what waits."""
    from fed_auc.node.policy.approval import approve as record_approval
    from fed_auc.node.policy.approval import pending
    from fed_auc.site import SiteDefinition

    try:
        site = SiteDefinition.from_toml(args.site)
        if args.digest is None:  # what waits for approval, to read before approving
            waiting = pending(site.policy)
            for digest, record in waiting:
                print(f"{digest}  run {record['run_id']}: {record['summary']}")
            print(
                f"fed-auc node approve: {site.name}: {len(waiting)} experiment(s) wait for "
                "approval; approve one with: fed-auc node approve --site FILE DIGEST"
            )
            return 0
        shown = record_approval(site.policy, args.digest)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"fed-auc node approve: {exc}") from None
    what = shown or "not met by this node yet (approved ahead of time)"
    print(f"fed-auc node approve: {site.name}: approved experiment {args.digest}: {what}")
    return 0


def _lock_state_dir(site) -> Path:
    """The site's state directory, locked for this process's life (``node_watch``)."""
    from fed_auc.transport.flower.node_watch import StateDirBusy, lock_state_dir

    try:
        return lock_state_dir(site.state_dir.resolve())
    except StateDirBusy as exc:
        raise SystemExit(f"fed-auc node: {site.name}: {exc}") from None


def require_flower(command: str) -> None:
    """Flower (and ``cryptography`` for the certificates) come with the ``flower`` extra."""
    try:
        import cryptography  # noqa: F401
        import flwr  # noqa: F401
    except ImportError as exc:
        raise SystemExit(
            f"fed-auc {command} needs the Flower extra ({exc.name} is missing): "
            "pip install -c constraints.txt 'fed-auc[flower]'"
        ) from None


def certs(args: argparse.Namespace) -> None:
    require_flower("certs")
    from fed_auc.transport.flower.certs import make_certs

    out = make_certs(args.out, args.site, args.host)
    print(f"CA, server certificate and keys for {args.site} in {out}")
