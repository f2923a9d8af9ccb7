"""The ``fed-auc`` command: simulate, demo, runs, dashboard; coordinator, node, certs (Flower)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fed_auc import evaluation_cli
from fed_auc.experiment import WARMUP_HEADS, ExperimentConfig
from fed_auc.threads import apply_threads, parse_threads
from fed_auc.transport.flower import cli as flower_cli

DEMO = {"rounds": 60, "sites": 4, "local_steps": 8, "decay_every": 320}


def _simulate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="run a federation on this machine (in-process nodes)")
    p.add_argument("--config", type=Path, help="TOML file whose keys are these options")
    p.add_argument(
        "--algorithm",
        help="codasca (default), coda_plus, local_sgda, fedavg, fed_norm_sgda, "
        "fed_norm_sgda_plus, fedsgda_mb, fedsgda_storm",
    )
    p.add_argument("--sites", type=int, help="number of synthetic hospital sites (default 4)")
    p.add_argument(
        "--site",
        action="append",
        type=str,
        dest="site_files",
        metavar="FILE",
        help="a site file (repeatable): run exactly these hospitals, each with its own data, as "
        "`fed-auc node --site FILE` serves it over Flower",
    )
    p.add_argument("--sites-dir", type=Path, help="every *.toml site file of this folder")
    p.add_argument("--rounds", type=int, help="communication rounds (default 20)")
    p.add_argument("--local-steps", type=int, help="local steps I per round (default 8)")
    p.add_argument(
        "--local-steps-range",
        help="MIN:MAX: each site draws its local steps τ_i per round from this range (seeded)",
    )
    p.add_argument("--batch-size", type=int, help="local batch size (default 32)")
    p.add_argument("--lr", type=float, help="local learning rate η (default 0.1)")
    p.add_argument("--model", help="tiny (default), small, densenet121, densenet169, densenet201")
    p.add_argument("--image-size", type=int, help="image side in pixels (default 28)")
    p.add_argument("--participation", type=float, help="fraction of sites per round (0, 1]")
    p.add_argument(
        "--eval-every", type=int, help="evaluate every N rounds; round 0 and the last always (1)"
    )
    p.add_argument("--seed", type=int, help="seed for data, sampling and initialization")
    p.add_argument("--loss", help="auc_margin (default), auc_square, ce (fedavg only)")
    p.add_argument("--num-labels", type=int, help="number of findings (multi-label if > 1)")
    p.add_argument("--gamma", type=float, help="proximal weight γ of CODA+/CODASCA (1/500)")
    p.add_argument("--eta-g", type=float, help="CODASCA server step η_g (default 1)")
    p.add_argument("--decay-every", type=int, help="T0: divide lr by 3 every T0 steps")
    p.add_argument(
        "--stage-output",
        help="CODA+/CODASCA stage output: last (default), or the paper's average (coda_plus) "
        "/ random_round (codasca)",
    )
    p.add_argument(
        "--min-pos-fraction", type=float, help="floor of positives per batch (default 0.05)"
    )
    p.add_argument(
        "--min-neg-fraction",
        type=float,
        help="floor of negatives per batch (default: 0.25 for image files, 0 for synthetic)",
    )
    p.add_argument(
        "--backend-option",
        action="append",
        metavar="NAME=VALUE",
        help="a further hyperparameter of the backend (repeatable), e.g. server_lr=0.5",
    )
    p.add_argument(
        "--partial-training",
        action="store_true",
        default=None,
        help="EmbracingFL: weak sites train only the output-side layer groups their memory fits",
    )
    p.add_argument(
        "--site-memory",
        type=lambda text: [b.strip() for b in text.split(",")],
        help="per-site memory budgets, comma-separated: fraction of a full step (0.15), bytes "
        "or 64MiB (default with --partial-training: strong, moderate 0.4, weak 0.15 tiers)",
    )
    p.add_argument("--personalize", choices=["head", "l2"], help="LSGD-PFL personal models")
    p.add_argument("--personal-lambda", type=float, help="λ of --personalize l2 (default 1)")
    p.add_argument(
        "--personal-lr-ratio",
        type=float,
        help="--personalize head: head lr / shared lr (default: the number of sites)",
    )
    p.add_argument(
        "--max-update-norm",
        type=float,
        help="reject a reply whose update (‖v_k − v‖, or the step a gradient reply makes the "
        "server take) exceeds this bound (default: no bound)",
    )
    p.add_argument(
        "--aggregation",
        help="mean (default: the backend's weighted mean) or centered_clip:τ (each reply's "
        "move clipped to within τ of the replies' median, then the backend's mean: exact "
        "for replies within τ, bounded influence for the others)",
    )
    p.add_argument(
        "--dp",
        choices=["update", "example"],
        help="client-side DP: 'update' clips and noises each site's whole update (default when "
        "--dp-clip is given), with a site-level (ε, δ) accountant per site (one hospital's whole "
        "data) and GroupNorm when there is noise; 'example' is DP-SGD: each example's gradient "
        "clipped in every local step, with an example-level (ε, δ) accountant per site and "
        "GroupNorm in the model",
    )
    p.add_argument(
        "--dp-clip",
        type=float,
        help="DP clip norm C: of the move each reply block makes the model take (--dp update) "
        "or of each example's gradient (--dp example)",
    )
    p.add_argument("--dp-noise", type=float, help="DP Gaussian noise multiplier σ (noise std σ·C)")
    p.add_argument(
        "--target-epsilon",
        type=float,
        help="derive σ so each site spends this ε over the run (--dp example: per example, "
        "--dp update: per site); a site whose budget is spent stops training",
    )
    p.add_argument("--delta", dest="dp_delta", type=float, help="DP's δ (1e-5)")
    p.add_argument(
        "--norm",
        choices=["batch", "group"],
        help="the network's normalization (default: group with --dp example or a noised "
        "--dp update, else batch)",
    )
    p.add_argument(
        "--secure-aggregation",
        action="store_true",
        default=None,
        help="secure aggregation: the coordinator learns only the sum of the sampled sites' "
        "masked replies (refuses --aggregation centered_clip and --max-update-norm)",
    )
    p.add_argument(
        "--secure-aggregation-threshold",
        type=int,
        help="shares that rebuild a site's secrets, from the site and its neighbours (default: "
        "a majority of them, ≥ 2)",
    )
    p.add_argument(
        "--secure-aggregation-neighbours",
        type=int,
        metavar="K",
        help="SecAgg+: each site masks and shares with K neighbours on a ring graph (even K, or "
        "n − 1 for the full graph; default: 2⌈log₂ n⌉ of n sampled sites, full up to 7)",
    )
    p.add_argument(
        "--resume",
        metavar="RUN_ID",
        help="continue an interrupted run from its last recorded round (its recorded options)",
    )
    _data_arguments(p)
    p.add_argument(
        "--warmup-rounds", type=int, help="fedavg + cross-entropy rounds before the AUC loss (0)"
    )
    p.add_argument(
        "--warmup-head",
        choices=WARMUP_HEADS,
        help="the classifier the AUC phase starts from: the warm-up's (keep, default), "
        "re-initialized (reset, LibAUC's recipe) or with its bias moved by −logit(p) "
        "(recenter: same ranking, scores near ½)",
    )
    p.add_argument(
        "--augment",
        help="training-time augmentation: none, flip, crop_flip (default: flip for image "
        "files, none for synthetic)",
    )
    p.add_argument(
        "--tta",
        help="test-time augmentation when scoring: none or flip (mean of image and mirror; "
        "default: flip when training flips, else none)",
    )
    p.add_argument(
        "--select",
        help="exported model: best_val (round with best validation AUC), last, or the mean of "
        "the K best (best_val:K) or last (last:K) rounds (default: best_val:5 for image "
        "files, best_val for synthetic)",
    )
    p.add_argument(
        "--hold-out",
        action="append",
        metavar="SITE",
        help="external validation: train without this site (repeatable), then score the "
        "exported model at every site",
    )
    p.add_argument(
        "--leave-each-out",
        action="store_true",
        help="one training per site without it, plus one with all: each site's held-out AUC "
        "beside its in-federation AUC",
    )
    p.add_argument("--register", metavar="NAME", help="also copy the model to MODELS_DIR/NAME")
    p.add_argument("--models-dir", default="models", help="model registry folder (models)")
    p.add_argument("--runs-dir", help="where the run store and run folders live (runs)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")


def _data_arguments(p: argparse.ArgumentParser) -> None:
    """--data and the options that say how to read and split it (simulate, data-card, evaluate)."""
    p.add_argument(
        "--data", help="synthetic (default), medmnist:PATH.npz or csv:PATH.csv[:IMAGE_ROOT]"
    )
    p.add_argument(
        "--partition",
        help="natural (CSV site column; CSV default), iid (default), dirichlet:ALPHA, "
        "quantity:ALPHA, imratio:R1,R2,...",
    )
    p.add_argument("--feature-shift", type=float, help="per-site contrast/brightness shift (0)")
    p.add_argument(
        "--positive-label",
        type=int,
        help="label value of the file that is the positive class, every other value negative "
        "(default: 1); e.g. 0 for BreastMNIST's malignant class",
    )
    p.add_argument("--uncertain", help="CheXpert -1 labels become: zeros (default), ones, ignore")
    p.add_argument("--frontal-only", action="store_true", default=None, help="frontal views only")
    p.add_argument(
        "--skip-bad-images",
        action="store_true",
        default=None,
        help="skip unreadable images with a warning (count in the data card) instead of failing",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fed-auc", description="Federated deep AUC maximization on medical images."
    )
    parser.add_argument(
        "--threads",
        type=_threads_arg,
        default=None,
        help="torch CPU threads, or 'auto' (default): the cores the load average leaves idle",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _simulate_parser(sub)
    demo = sub.add_parser("demo", help="run the demo federation with the embedded defaults")
    demo.add_argument("--runs-dir", default="runs")
    demo.add_argument("--json", action="store_true")
    card = sub.add_parser("data-card", help="write a data card (Markdown + JSON) per site")
    _data_arguments(card)
    card.add_argument("--sites", type=int, help="number of sites (default 4; natural: the data's)")
    card.add_argument("--image-size", type=int, default=28)
    card.add_argument("--seed", type=int, default=0)
    card.add_argument("--out", default="data_cards", help="output folder (data_cards)")
    ev = sub.add_parser("evaluate", help="score a registered model per site, with bootstrap CIs")
    ev.add_argument("--model", required=True, help="model.pt or its folder (fed-auc-model/1)")
    _data_arguments(ev)
    ev.add_argument("--sites", type=int, help="number of sites to partition into")
    ev.add_argument("--seed", type=int, default=0, help="partition and bootstrap seed")
    ev.add_argument("--manifest", type=Path, help="a run's partition.json: exactly its sites")
    ev.add_argument("--split", default="test", choices=["train", "val", "test"])
    ev.add_argument("--image-size", type=int, help="default: the model card's")
    ev.add_argument("--by-site", action="store_true", help="per site as well as pooled")
    ev.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (1000)")
    ev.add_argument("--tta", help="test-time augmentation: none or flip (default: the card's)")
    ev.add_argument("--out", required=True, type=Path, help="folder for JSON, CSV, ROC PNG")
    evaluation_cli.add_arguments(ev)
    runs = sub.add_parser("runs", help="list the runs in a runs directory")
    runs.add_argument("--runs-dir", default="runs")
    runs.add_argument("--json", action="store_true")
    dashboard = sub.add_parser("dashboard", help="open the Streamlit dashboard over a run store")
    dashboard.add_argument("--runs-dir", default="runs")
    dashboard.add_argument("--port", type=int, default=8501)
    dashboard.add_argument("--host", default="127.0.0.1", help="address to listen on")
    flower_cli.add_parsers(sub)
    return parser


def config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    """Defaults, then the TOML file, then the flags given on the command line."""
    fields = {f.name for f in dataclasses.fields(ExperimentConfig)}
    values: dict[str, Any] = {}
    if args.config is not None:
        values.update(read_config_file(args.config, fields))
    values.update({k: v for k, v in vars(args).items() if k in fields and v is not None})
    if args.sites_dir is not None:
        from fed_auc.site import site_files_in

        try:
            found = [str(p) for p in site_files_in(args.sites_dir)]
        except ValueError as exc:
            raise SystemExit(f"fed-auc simulate: --sites-dir: {exc}") from None
        values["site_files"] = [*values.get("site_files", []), *found]
    if values.get("site_files") and args.sites is not None:
        raise SystemExit("fed-auc simulate: give --sites or site files (--site/--sites-dir)")
    if args.backend_option:
        options = dict(values.get("backend_options", {}))
        options.update(parse_backend_option(text) for text in args.backend_option)
        values["backend_options"] = options
    try:
        return ExperimentConfig(**values)
    except (TypeError, ValueError) as exc:
        source = f" (config {args.config})" if args.config else ""
        raise SystemExit(f"fed-auc simulate: invalid option{source}: {exc}") from None


def parse_backend_option(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` with VALUE read as TOML (numbers, booleans, quoted strings) or a string."""
    name, sep, raw = text.partition("=")
    if not sep or not name.strip():
        raise SystemExit(f"fed-auc: --backend-option must look like NAME=VALUE, got {text!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return name.strip(), value


def read_config_file(path: Path, fields: set[str]) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SystemExit(f"fed-auc: cannot read config {path}: {exc}") from None
    unknown = sorted(set(data) - fields)
    if unknown:
        raise SystemExit(
            f"fed-auc: config {path}: unknown key(s) {unknown}; valid keys: {sorted(fields)}"
        )
    return data


def simulate(
    config: ExperimentConfig | None,
    as_json: bool,
    register: str | None = None,
    models_dir: str = "models",
    resume: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``config``, or resume the run ``resume`` = (runs dir, run id), with a progress bar;
    optionally register the exported model."""
    from tqdm import tqdm

    from fed_auc.simulation import rounds_left, run_simulation

    if resume is not None:
        try:
            total, desc = rounds_left(*resume), f"resume {resume[1]}"
        except KeyError as exc:
            raise SystemExit(f"fed-auc simulate --resume: {exc.args[0]}") from None
    else:
        total, desc = config.rounds, config.algorithm
    bar = tqdm(total=total, desc=desc, unit="round", file=sys.stderr)

    def on_round(record) -> None:
        bar.set_postfix(auc=_fmt(record.global_auc), worst=_fmt(record.worst_site_auc))
        bar.update(1)

    try:
        if resume is not None:
            summary = _resume(resume, on_round)
        else:
            summary = run_simulation(config, on_round)
    finally:
        bar.close()
    if register:
        from fed_auc.registry import register_model

        target = register_model(Path(summary["model_path"]).parent, register, models_dir)
        summary["registered"] = str(target)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        aucs = summary["global_auc"]
        print(
            f"run {summary['run_id']}: pooled test AUC {_fmt(aucs[0])} (round 0) → "
            f"{_fmt(aucs[-1])} (round {len(aucs) - 1}); "
            f"worst site {_fmt(summary['worst_site_auc'][-1])}"
        )
        print(f"model and model card: {Path(summary['model_path']).parent}")
    return summary


def list_runs(runs_dir: str, as_json: bool) -> None:
    from fed_auc.store import STORE_FILE, RunStore

    if not (Path(runs_dir) / STORE_FILE).exists():
        raise SystemExit(f"fed-auc runs: no run store in {runs_dir!r} (expected {STORE_FILE})")
    with RunStore(runs_dir) as store:
        runs = store.runs()
        rows = []
        for run in runs.itertuples():
            rounds = store.rounds(run.id)
            rows.append(
                {
                    "run_id": run.id,
                    "algorithm": run.algorithm,
                    "status": run.status,
                    "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started_at)),
                    "rounds": int(rounds["round"].max()) if len(rounds) else 0,
                    "global_auc": _num(rounds["global_auc"].iloc[-1]) if len(rounds) else None,
                }
            )
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        print(f"no runs in {runs_dir}")
    for r in rows:
        print(
            f"{r['run_id']}  {r['algorithm']:<11} {r['status']:<10} {r['started']}  "
            f"rounds {r['rounds']:<4} AUC {_fmt(r['global_auc'])}"
        )


def _resume(resume: tuple[str, str], on_round) -> dict[str, Any]:
    from fed_auc.coordinator import FederationError
    from fed_auc.simulation import resume_simulation

    try:
        return resume_simulation(*resume, on_round=on_round)
    except (ValueError, FederationError) as exc:
        raise SystemExit(f"fed-auc simulate --resume: {exc}") from None


def _resume_runs_dir(args: argparse.Namespace) -> str:
    """``--resume`` takes every option from the recorded run; only where it lives may be given."""
    given = [
        name
        for name, value in vars(args).items()
        if value not in (None, False)
        and name not in ("command", "resume", "runs_dir", "json", "models_dir")
    ]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise SystemExit(f"fed-auc simulate --resume uses the run's recorded options; drop {flags}")
    return args.runs_dir or "runs"


def dashboard(runs_dir: str, port: int, host: str) -> int:
    """``streamlit run app/streamlit_app.py``, headless, no usage statistics; the runs
    directory travels in FED_AUC_RUNS_DIR. The app ships in the wheel beside ``fed_auc``.

    SIGTERM, SIGINT and SIGHUP are passed on to Streamlit and waited for, and Streamlit is
    told by the kernel to stop if this process dies anyway: it never outlives the command."""
    import importlib.util
    import os
    import signal
    import subprocess

    script = Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py"
    if not script.exists():
        raise SystemExit(f"fed-auc dashboard: no app at {script} (this installation lacks app/)")
    if importlib.util.find_spec("streamlit") is None:  # before printing a URL nothing serves
        raise SystemExit(
            "fed-auc dashboard needs the dashboard extra (streamlit is missing): "
            "pip install -c constraints.txt -e '.[dashboard]'"
        )
    env = {**os.environ, "FED_AUC_RUNS_DIR": str(Path(runs_dir).resolve())}
    command = [
        sys.executable, "-m", "streamlit", "run", str(script),
        "--server.headless", "true", "--server.port", str(port), "--server.address", host,
        "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal",
    ]  # fmt: skip
    print(f"fed-auc dashboard: http://{host}:{port} over {runs_dir}", file=sys.stderr)
    process = subprocess.Popen(command, env=env, preexec_fn=_stop_with_parent)
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        process.send_signal(signum)

    forwarded = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {s: signal.signal(s, forward) for s in forwarded}
    try:
        code = process.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if process.poll() is None:  # an exception here: never leave Streamlit serving
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    return 0 if received and code in (0, -received[-1]) else code


def _stop_with_parent() -> None:
    """In the child before exec: SIGTERM it when its parent dies (Linux ``PR_SET_PDEATHSIG``),
    so that even a SIGKILLed ``fed-auc dashboard`` leaves no Streamlit behind."""
    import ctypes
    import signal

    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def _data_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "feature_shift": args.feature_shift or 0.0,
        "uncertain": args.uncertain or "zeros",
        "frontal_only": bool(args.frontal_only),
        "skip_bad_images": bool(args.skip_bad_images),
        "positive_label": args.positive_label,
    }


def _num_sites(args: argparse.Namespace, default: int) -> int | None:
    """--sites, else `default`; None for the natural partition (the data's own sites)."""
    if args.sites is not None:
        return args.sites
    natural = args.partition == "natural" or (
        args.partition is None and (args.data or "").startswith("csv:")
    )
    return None if natural else default


def write_data_cards(args: argparse.Namespace) -> None:
    from fed_auc.data.cards import write_cards
    from fed_auc.data.spec import load_sites

    try:
        sites, _ = load_sites(
            args.data or "synthetic",
            args.partition,
            _num_sites(args, 4),
            args.seed,
            args.image_size,
            **_data_options(args),
        )
    except ValueError as exc:
        raise SystemExit(f"fed-auc data-card: {exc}") from None
    for path in write_cards(sites, args.out):
        print(path)


def run_evaluate(args: argparse.Namespace) -> None:
    if args.site_files and args.federation:
        raise SystemExit("fed-auc evaluate: give --site files (local) or --federation, not both")
    if args.federation is not None:
        evaluation_cli.evaluate_federation(args)
        return
    if args.site_files:
        evaluation_cli.evaluate_site_files(args)
        return
    from fed_auc.data.spec import load_pool, load_sites, parse_data_spec
    from fed_auc.evaluate import evaluate_model, load_registered_model, site_splits, write_results

    try:
        model, card = load_registered_model(args.model)
        size = args.image_size or card.get("image_size") or 28
        data = args.data or "synthetic"
        if args.manifest is not None:
            from fed_auc.data.partition import sites_from_manifest

            options = _data_options(args)
            options.pop("feature_shift")
            pool = load_pool(parse_data_spec(data), size, **options)
            try:
                manifest = json.loads(args.manifest.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise ValueError(f"cannot read manifest {args.manifest}: {exc}") from None
            sites = sites_from_manifest(pool, manifest)
        else:
            sites, _ = load_sites(
                data,
                args.partition,
                _num_sites(args, 1),
                args.seed,
                size,
                num_labels=len(card["label_names"]),
                **_data_options(args),
            )
        splits = site_splits(sites, args.split, args.by_site)
        results = evaluate_model(
            model, card, splits, n_boot=args.bootstrap, seed=args.seed, tta=args.tta
        )
    except ValueError as exc:
        raise SystemExit(f"fed-auc evaluate: {exc}") from None
    results.update(model=str(args.model), data=data, split=args.split)
    paths = write_results(results, args.out)
    for site, labels in results["sites"].items():
        for label, r in labels.items():
            ci = f" [{_fmt(r['ci_lo'])}, {_fmt(r['ci_hi'])}]" if r["ci_lo"] is not None else ""
            text = r["note"] or f"AUC {_fmt(r['auc'])}{ci}"
            print(f"{site:<12} {label:<18} n {r['n']:<5} {text}")
    print(f"results: {paths['json']}, {paths['csv']}, {paths['roc']}")


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _num(value: Any) -> float | None:
    return None if value is None or value != value else float(value)


def _threads_arg(value: str) -> int | None:
    try:
        return parse_threads(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(argv: Sequence[str] | None = None) -> int:
    # One line per round as it happens, also when the output is a file or a pipe.
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    args = build_parser().parse_args(argv)
    apply_threads(args.threads)
    if args.command == "simulate" and args.resume is not None:
        simulate(None, args.json, resume=(_resume_runs_dir(args), args.resume))
    elif args.command == "simulate" and args.leave_each_out:
        evaluation_cli.leave_each_out(config_from_args(args), args.json)
    elif args.command == "simulate":
        simulate(config_from_args(args), args.json, args.register, args.models_dir)
    elif args.command == "demo":
        config = ExperimentConfig(runs_dir=args.runs_dir, **DEMO)
        simulate(config, args.json)
        if not args.json:
            print(
                f"Every round is in the run store {Path(args.runs_dir) / 'fed_auc.sqlite'}; "
                f"see it with `fed-auc dashboard --runs-dir {args.runs_dir}` "
                f"or list the runs with `fed-auc runs --runs-dir {args.runs_dir}`."
            )
    elif args.command == "runs":
        list_runs(args.runs_dir, args.json)
    elif args.command == "dashboard":
        return dashboard(args.runs_dir, args.port, args.host)
    elif args.command == "coordinator":
        import signal

        signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop like Ctrl-C
        try:
            flower_cli.coordinator(args)
        except KeyboardInterrupt:
            print("fed-auc coordinator: stopped; the run is marked failed (resumable)")
            return 130
    elif args.command == "node":
        return flower_cli.node(args)
    elif args.command == "certs":
        flower_cli.certs(args)
    elif args.command == "data-card":
        write_data_cards(args)
    elif args.command == "evaluate":
        run_evaluate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
