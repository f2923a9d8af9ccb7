"""``fed-auc evaluate``: a registered model scored on a data set split into sites, on site files
(local) or over the federation.

Local, ``--data`` (with ``--partition``/``--sites`` or a run's ``--manifest``): the sites are
cut from one data set as ``simulate`` cuts them. Local, ``--site FILE``: the caller holds the
sites' files; each is loaded as its node loads it (the card's image size and seed, so its test
split is the one the model was tested on). Both are scored with ``fed_auc.evaluate.local``.
Federated, ``--federation CONFIG``: an evaluation-only run over Flower
(``fed_auc.transport.flower.evaluation``); nothing per image leaves a node. With
``--compare-to B``: every node scores both models on its own test split and answers their
paired AUC difference per label (``fed_auc.evaluate.federated_compare``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fed_auc.cli.data import add_data_arguments, data_option, data_reading, num_sites
from fed_auc.cli.experiment_options import add_compute_arguments
from fed_auc.evaluate.job import describe, trained_sites


def add_evaluate_parser(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser("evaluate", help="score a registered model per site, with bootstrap CIs")
    ev.add_argument("--model", required=True, help="model.pt or its folder (fed-auc-model/1)")
    add_data_arguments(ev)
    ev.add_argument("--sites", type=int, help="number of sites to partition into")
    ev.add_argument("--seed", type=int, default=0, help="partition and bootstrap seed")
    ev.add_argument("--manifest", type=Path, help="a run's partition.json: exactly its sites")
    ev.add_argument("--split", default="test", choices=["train", "val", "test"])
    ev.add_argument("--image-size", type=int, help="default: the model card's")
    ev.add_argument("--by-site", action="store_true", help="per site as well as pooled")
    ev.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (1000)")
    ev.add_argument("--tta", help="test-time augmentation: none or flip (default: the card's)")
    ev.add_argument("--out", required=True, type=Path, help="folder for JSON, CSV, ROC PNG")
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
    ev.add_argument(
        "--compare-to",
        type=Path,
        metavar="MODEL",
        help="--federation: every node scores --model (A) and this model (B) on its own test "
        "split and answers only their paired AUC difference (DeLong); recorded as "
        "`fed-auc runs --compare` records it",
    )
    add_compute_arguments(ev, "local scoring; not with --federation")
    ev.add_argument(
        "--runs-dir",
        help="where --site results are recorded (runs); --federation: override the config's "
        "runs_dir",
    )


def evaluate_command(args: argparse.Namespace) -> int:
    if args.site_files and args.federation:
        raise SystemExit("fed-auc evaluate: give --site files (local) or --federation, not both")
    if args.compare_to is not None and args.federation is None:
        raise SystemExit(
            "fed-auc evaluate --compare-to compares at a federation's nodes (--federation "
            "CONFIG); two runs whose images are here: fed-auc runs --compare A B"
        )
    if args.federation is not None:
        if args.device is not None or args.precision is not None:
            raise SystemExit(
                "fed-auc evaluate --federation: each node scores on its own device and "
                "precision ([node] device/precision in its site file); remove --device/--precision"
            )
        evaluate_federation(args)
    elif args.site_files:
        evaluate_site_files(args)
    else:
        evaluate_data(args)
    return 0


def evaluate_site_files(args: argparse.Namespace) -> None:
    """Local evaluation of the sites given as files; held-out sites are marked. Recorded in
    the run store as the federated job records the same model and sites."""
    from fed_auc.evaluate.job import card_request, record_local
    from fed_auc.evaluate.local import evaluate_model, write_results
    from fed_auc.registry.load import load_registered_model
    from fed_auc.site import check_site_data, load_site_files

    try:
        model, card = load_registered_model(args.model)
        size = args.image_size or card.get("image_size") or 28
        sites = {}
        for site in load_site_files([str(f) for f in args.site_files]):
            data = site.load(size, len(card["label_names"]), card.get("seed", 0))
            check_site_data(site, data)
            sites[site.name] = data
        splits = {name: getattr(data, args.split) for name, data in sites.items()}
        results = evaluate_model(
            model, card, splits, args.bootstrap, args.seed, args.tta, _compute(args)
        )
    except ValueError as exc:
        raise SystemExit(f"fed-auc evaluate: {exc}") from None
    held = sorted(s for s in splits if s not in trained_sites(card))
    results.update(model=str(args.model), split=args.split, held_out=held, transport="none")
    paths = {k: str(v) for k, v in write_results(results, args.out).items()}
    request = card_request(model, card, [args.split], args.bootstrap, args.seed)
    runs_dir = args.runs_dir or "runs"
    run_id = record_local(runs_dir, results, request, card, args.model, sites, paths)
    for line in describe(results):
        print(line)
    print(f"results: {paths['json']}, {paths['csv']}, {paths['roc']}")
    print(f"evaluation run {run_id} in {runs_dir}")
    warn_suspect_images(sites.values())


def evaluate_federation(args: argparse.Namespace) -> dict[str, Any]:
    """An evaluation-only run over Flower; returns its summary."""
    from fed_auc.cli.federation import require_flower
    from fed_auc.evaluate.job import new_evaluation_run
    from fed_auc.experiment.files import load_experiment
    from fed_auc.store.run_store import RunStore

    require_flower("evaluate --federation")
    from fed_auc.transport.flower.launch import run_coordinator

    if args.split != "test":
        raise SystemExit(
            "fed-auc evaluate --federation scores the test split (--with-val: also val)"
        )
    job = {
        "model": str(Path(args.model).resolve()),
        "splits": ["test", "val"] if args.with_val else ["test"],
        "bootstrap": args.bootstrap,
        "seed": args.seed,
        "out": str(Path(args.out).resolve()),
    }
    if args.compare_to is not None:
        job.update(compare_to=str(Path(args.compare_to).resolve()), splits=["test"])
        check_pair(args, job)
    experiment = load_experiment(args.federation, {"runs_dir": args.runs_dir})
    runs_dir = experiment["experiment"]["runs_dir"]
    with RunStore(runs_dir) as store:
        record = {"evaluation": job, "flower": experiment["flower"], "transport": "flower"}
        run_id = new_evaluation_run(store, record)
    experiment = {**experiment, "run_id": run_id, "evaluation": job}
    from fed_auc.transport.flower.launch import CoordinatorFailed

    try:
        summary = run_coordinator(experiment, Path(runs_dir) / "flower", echo=_stderr)
    except CoordinatorFailed as exc:  # one line: what failed (no traceback)
        raise SystemExit(f"fed-auc evaluate --federation: {exc}") from None
    if args.compare_to is not None:
        print_comparison(summary["comparison"])
        print(f"comparison run {run_id}; results in {job['out']}")
        return summary
    results = json.loads((Path(job["out"]) / "evaluation.json").read_text())
    for line in describe(results):
        print(line)
    print(f"evaluation run {run_id}; results in {job['out']}")
    return summary


def check_pair(args: argparse.Namespace, job: dict[str, Any]) -> None:
    """Refuse before any node is asked: a comparison on the test split only, of two models
    with the same labels and positive class whose nodes load the same test images.

    Why ``evaluate --federation --compare-to`` and not ``runs --compare --federation``: a
    federation's comparison names models, as this command does, and runs exactly its
    evaluation-only Flower run; the runs of the two models may live in another store."""
    from fed_auc.evaluate.federated_compare import comparison_request

    if args.with_val:
        raise SystemExit("fed-auc evaluate --compare-to compares on the test split; no --with-val")
    try:
        comparison_request(job["model"], job["compare_to"])
    except (ValueError, OSError) as exc:
        raise SystemExit(f"fed-auc evaluate --compare-to: {exc}") from None


def print_comparison(comparison: dict[str, Any]) -> None:
    """The lines ``fed-auc runs --compare`` prints, then each site that did not answer."""
    from fed_auc.cli.compare import comparison_lines

    for line in comparison_lines(comparison, comparison["rows"]):
        print(line)
    for site, reason in comparison.get("failures", {}).items():
        print(f"site {site} did not answer: {reason}")


def warn_suspect_images(sites) -> None:
    """The data cards' warnings (constant or saturated image files) on stderr: an AUC on such
    images says little about the model."""
    from fed_auc.data.cards import card_warnings

    for site in sites:
        for line in card_warnings(site):
            _stderr(f"fed-auc evaluate: warning: site {site.name}: {line}")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def evaluate_data(args: argparse.Namespace) -> None:
    """Local evaluation of the sites cut from ``--data``, pooled and optionally per site."""
    from fed_auc.data.spec import load_pool, load_sites, parse_data_spec
    from fed_auc.evaluate.local import evaluate_model, site_splits, write_results
    from fed_auc.registry.load import load_registered_model

    try:
        model, card = load_registered_model(args.model)
        size = args.image_size or card.get("image_size") or 28
        data = args.data or "synthetic"
        if args.manifest is not None:
            from fed_auc.data.partition import sites_from_manifest

            # the pool's positive class is named by the model's card (load_pool names none)
            pool = load_pool(parse_data_spec(data), size, data_reading(args))
            try:
                manifest = json.loads(args.manifest.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise ValueError(f"cannot read manifest {args.manifest}: {exc}") from None
            sites = sites_from_manifest(pool, manifest)
        else:
            sites, _ = load_sites(
                data,
                args.partition,
                num_sites(args, 1),
                args.seed,
                size,
                num_labels=len(card["label_names"]),
                feature_shift=data_option(args, "feature_shift"),
                reading=data_reading(args),
            )
        splits = site_splits(sites, args.split, args.by_site)
        results = evaluate_model(
            model, card, splits, args.bootstrap, args.seed, args.tta, _compute(args)
        )
    except ValueError as exc:
        raise SystemExit(f"fed-auc evaluate: {exc}") from None
    results.update(model=str(args.model), data=data, split=args.split)
    paths = write_results(results, args.out)
    for line in describe(results):
        print(line)
    print(f"results: {paths['json']}, {paths['csv']}, {paths['roc']}")
    warn_suspect_images(sites)


def _compute(args: argparse.Namespace):
    """The device and precision of a local evaluation (a missing CUDA device is an error)."""
    from fed_auc.node.compute import Compute

    return Compute.of(args.device or "auto", args.precision or "fp32")
