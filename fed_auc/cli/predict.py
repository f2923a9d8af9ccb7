"""``fed-auc predict``: score new images with a registered model into a CSV (and one DICOM
Structured Report per study, optionally stored back to the PACS), recorded in the run store
(``fed_auc.predict``). Images come from a folder, a CSV or a PACS query (``--pacs SITE_FILE``).

Bad input (no model, an empty folder, a CSV without a path column) is refused in one line
before anything is written. An image that cannot be read is named in the CSV and in one line
here; the others are scored. Exit status: 0 every image scored, 3 the job ran but some images
could not be read, 1 refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fed_auc.cli.experiment_options import add_compute_arguments

PARTIAL = 3  # the exit status of a job some of whose images could not be read


def add_predict_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="score new images with a registered model (CSV, DICOM SR)")
    p.add_argument("--model", required=True, help="a registered model: model.pt or its folder")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--images", type=Path, metavar="FOLDER",
                        help="PNG/JPEG/DICOM (.dcm) files in FOLDER and below, sorted")  # fmt: skip
    source.add_argument(
        "--csv",
        type=Path,
        metavar="FILE",
        help="a CSV with a Path/path/image column (relative to the CSV's folder)",
    )
    source.add_argument(
        "--pacs",
        type=Path,
        metavar="SITE_FILE",
        help="the studies a query finds on the PACS this site file's [data.pacs] names (its "
        "url, login and query), fetched into the site's state directory",
    )
    p.add_argument(
        "--query",
        action="append",
        metavar="KEY=VALUE",
        help="--pacs: a QIDO-RS filter instead of the site file's query (repeatable), e.g. "
        "StudyDate=20261101-20261130",
    )
    p.add_argument("--out", required=True, type=Path, help="the prediction CSV to write")
    p.add_argument(
        "--sr-dir",
        type=Path,
        metavar="DIR",
        help="also write one DICOM Structured Report per study (DICOM inputs)",
    )
    p.add_argument(
        "--stow",
        action="store_true",
        help="--pacs with --sr-dir: store the structured reports on that PACS (STOW-RS)",
    )
    p.add_argument(
        "--store",
        metavar="RUNS_DIR",
        help="the run store to record the job in (default: the one of the runs "
        "directory holding the model, else ./runs)",
    )
    p.add_argument(
        "--aspect",
        default="pad",
        choices=["pad", "crop", "stretch"],
        help="non-square images: as the model's sites read them (default pad)",
    )
    p.add_argument("--batch-size", type=int, help="images per forward pass (default: by size)")
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="image-decoding processes, one torch thread each (default 0: here)",
    )
    p.add_argument(
        "--images-outside-root",
        action="store_true",
        help="--csv: allow paths leading outside the CSV's folder",
    )
    add_compute_arguments(p, "scoring")


def default_store(model: str | Path) -> Path:
    """The runs directory a registered model was exported into (``<runs>/<run>/model``) when
    it holds a store, else ``runs``: a job is recorded where its model's run is."""
    from fed_auc.store.run_store import STORE_FILE

    path = Path(model).resolve()
    folder = path if path.is_dir() else path.parent
    runs = folder.parent.parent
    return runs if (runs / STORE_FILE).is_file() else Path("runs")


def parse_query(pairs: list[str] | None) -> dict[str, str] | None:
    """``--query KEY=VALUE`` pairs as a QIDO-RS filter table (None: the site file's)."""
    if not pairs:
        return None
    query = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--query {pair!r}: expected KEY=VALUE, e.g. ModalitiesInStudy=DX")
        query[key.strip()] = value.strip()
    return query


def predict_command(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from fed_auc.node.compute import Compute
    from fed_auc.predict.items import csv_items, folder_items, pacs_items
    from fed_auc.predict.job import run_prediction, store_reports

    try:
        if not Path(args.model).exists():
            raise ValueError(f"--model {args.model}: no such file or folder")
        if args.batch_size is not None and args.batch_size < 1:
            raise ValueError(f"--batch-size must be ≥ 1, got {args.batch_size}")
        if args.workers < 0:
            raise ValueError(f"--workers must be ≥ 0, got {args.workers}")
        if args.stow and (args.pacs is None or args.sr_dir is None):
            raise ValueError(
                "--stow stores the reports of --sr-dir on the PACS of --pacs: give both"
            )
        if args.query and args.pacs is None:
            raise ValueError("--query filters the studies of --pacs SITE_FILE")
        if args.images is not None:
            inputs = folder_items(args.images)
        elif args.pacs is not None:
            inputs = pacs_items(args.pacs, parse_query(args.query))
        else:
            inputs = csv_items(args.csv, args.images_outside_root)
        compute = Compute.of(args.device or "auto", args.precision or "fp32")
    except ValueError as exc:
        raise SystemExit(f"fed-auc predict: {exc}") from None
    for note in inputs.notes:
        print(f"fed-auc predict: {note}", file=sys.stderr)
    store = args.store or default_store(args.model)
    bar = tqdm(total=len(inputs.items), desc="predict", unit="image", file=sys.stderr)

    def advance(results) -> None:
        bar.update(len(results))
        failed = sum(r.error is not None for r in results)
        if failed:
            bar.set_postfix_str(f"{failed} unreadable in the last batch", refresh=False)

    try:
        result = run_prediction(
            args.model, inputs, args.out, store, args.sr_dir, compute, args.aspect,
            args.batch_size, args.workers, on_batch=advance,
        )  # fmt: skip
    except ValueError as exc:  # the model could not be loaded: nothing was scored
        raise SystemExit(f"fed-auc predict: {exc}") from None
    finally:
        bar.close()
    for source, reason in result.failures:  # the reader's reason names the file, mostly
        named = reason if source in reason else f"{source}: {reason}"
        print(f"fed-auc predict: not scored: {named}", file=sys.stderr)
    for note in result.notes:
        print(f"fed-auc predict: {note}")
    model = result.model
    counts = ", ".join(
        f"{label} ({positive}) positive at ≥ {t:g}: {n}"
        for label, positive, t, n in zip(model.label_names, model.positive_class,
                                         model.thresholds, result.positives, strict=True)
    )  # fmt: skip
    scored = result.n_images - len(result.failures)
    print(f"scored {scored} of {result.n_images} image(s) with model {model.run_id} "
          f"(sha256 {model.sha256[:12]}…); {counts}")  # fmt: skip
    print(f"predictions: {result.output}")
    if args.sr_dir is not None:
        print(f"structured reports: {len(result.reports)} in {args.sr_dir}")
    if args.stow and result.reports:
        try:
            print(store_reports(args.pacs, result.reports))
        except ValueError as exc:  # the CSV and the reports are written: say what was not
            raise SystemExit(f"fed-auc predict: reports not stored: {exc}") from None
    print(f"prediction job {result.job_id} in {store}")
    return PARTIAL if result.failures else 0
