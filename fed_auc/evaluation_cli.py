"""``fed-auc evaluate`` on site files (local) or over the federation, and leave-each-site-out.

Local, ``--site FILE``: the caller holds the sites' files; each is loaded as its node loads it
(the card's image size and seed, so its test split is the one the model was tested on) and
scored with ``fed_auc.evaluate``. Federated, ``--federation CONFIG``: an evaluation-only run
over Flower (``fed_auc.transport.flower.evaluation``); nothing per image leaves a node.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fed_auc.evaluation_job import describe, trained_sites


def add_arguments(ev: argparse.ArgumentParser) -> None:
    ev.add_argument(
        "--site",
        action="append",
        type=Path,
        dest="site_files",
        metavar="FILE",
        help="score at these site files' test splits, as their nodes split them (repeatable)",
    )
    ev.add_argument(
        "--federation",
        type=Path,
        metavar="CONFIG",
        help="an experiment TOML with [flower]: score at every node of that federation "
        "(an evaluation-only run; results also in the run store)",
    )
    ev.add_argument(
        "--with-val", action="store_true", help="--federation: the validation split too"
    )
    ev.add_argument("--runs-dir", help="--federation: override the config's runs_dir")


def evaluate_site_files(args: argparse.Namespace) -> None:
    """Local evaluation of the sites given as files; held-out sites are marked."""
    from fed_auc.evaluate import evaluate_model, load_registered_model, write_results
    from fed_auc.site import check_site_data, load_site_files

    try:
        model, card = load_registered_model(args.model)
        size = args.image_size or card.get("image_size") or 28
        splits = {}
        for site in load_site_files([str(f) for f in args.site_files]):
            data = site.load(size, len(card["label_names"]), card.get("seed", 0))
            check_site_data(site, data)
            splits[site.name] = getattr(data, args.split)
        results = evaluate_model(
            model, card, splits, n_boot=args.bootstrap, seed=args.seed, tta=args.tta
        )
    except ValueError as exc:
        raise SystemExit(f"fed-auc evaluate: {exc}") from None
    held = sorted(s for s in splits if s not in trained_sites(card))
    results.update(model=str(args.model), split=args.split, held_out=held, transport="none")
    paths = write_results(results, args.out)
    for line in describe(results):
        print(line)
    print(f"results: {paths['json']}, {paths['csv']}, {paths['roc']}")


def evaluate_federation(args: argparse.Namespace) -> dict[str, Any]:
    """An evaluation-only run over Flower; returns its summary."""
    from fed_auc.run import git_revision
    from fed_auc.store import RunStore
    from fed_auc.transport.flower.cli import load_experiment, require_flower

    require_flower("evaluate --federation")
    from fed_auc.transport.flower.launch import run_coordinator

    if args.split != "test":
        raise SystemExit(
            "fed-auc evaluate --federation scores the test split (--with-val: also val)"
        )
    experiment = load_experiment(args.federation, {"runs_dir": args.runs_dir})
    job = {
        "model": str(Path(args.model).resolve()),
        "splits": ["test", "val"] if args.with_val else ["test"],
        "bootstrap": args.bootstrap,
        "seed": args.seed,
        "out": str(Path(args.out).resolve()),
    }
    runs_dir = experiment["experiment"]["runs_dir"]
    with RunStore(runs_dir) as store:
        record = {"evaluation": job, "flower": experiment["flower"], "transport": "flower"}
        run_id = store.create_run("evaluate", record, git_revision())
    experiment = {**experiment, "run_id": run_id, "evaluation": job}
    summary = run_coordinator(experiment, Path(runs_dir) / "flower", echo=_stderr)
    results = json.loads((Path(job["out"]) / "evaluation.json").read_text())
    for line in describe(results):
        print(line)
    print(f"evaluation run {run_id}; results in {job['out']}")
    return summary


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def leave_each_out(config: Any, as_json: bool) -> list[dict[str, Any]]:
    """``fed-auc simulate --leave-each-out``: one run with every site, one per site without it."""
    import dataclasses

    from fed_auc.holdout import leave_each_out as run_all
    from fed_auc.simulation import load_in_process_sites, run_simulation

    if config.hold_out:
        raise SystemExit("fed-auc simulate: --leave-each-out chooses the held-out sites itself")
    names = [site.data.name for site in load_in_process_sites(config)[0]]

    def train(held_out: list[str]) -> dict[str, Any]:
        print(f"leave-each-out: training without {held_out or 'no site'}", file=sys.stderr)
        return run_simulation(dataclasses.replace(config, hold_out=held_out))

    rows = run_all(names, train)
    if as_json:
        print(json.dumps(rows, indent=2))
        return rows
    for row in rows:
        held, within = row["held_out_auc"], row["in_federation_auc"]
        print(
            f"{row['site']:<20} held-out AUC {_aucs(held)} (run {row['held_out_run']})  "
            f"in-federation AUC {_aucs(within)} (run {row['in_federation_run']})"
        )
    return rows


def _aucs(values: list[float | None] | None) -> str:
    if values is None:
        return "not reported"
    return "/".join("undefined" if v is None else f"{v:.3f}" for v in values)
