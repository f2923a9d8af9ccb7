"""The experiment's options on the command line: ``fed-auc simulate``'s flags, and how they
become an ``ExperimentConfig`` (defaults, then ``--config`` TOML, then the flags given)."""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from fed_auc.cli.data import add_data_arguments
from fed_auc.experiment.checks import WARMUP_HEADS
from fed_auc.experiment.config import ExperimentConfig


def add_simulate_parser(sub: argparse._SubParsersAction) -> None:
    """Every flag maps to an ``ExperimentConfig`` field of the same name (None: not given)."""
    p = sub.add_parser("simulate", help="run a federation on this machine (in-process nodes)")
    _federation_options(p)
    _backend_options(p)
    _weak_site_options(p)
    _protection_options(p)
    _run_options(p)


def _federation_options(p: argparse.ArgumentParser) -> None:
    """The federation: which sites, how many rounds and steps, the network, the loss."""
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
    p.add_argument(
        "--lr",
        type=float,
        help="local learning rate η (default: 0.2 for image files, 0.1 for synthetic)",
    )
    p.add_argument(
        "--model",
        help="tiny, small, densenet121, densenet169, densenet201 (default: small for image "
        "files, tiny for synthetic)",
    )
    p.add_argument("--image-size", type=int, help="image side in pixels (default 28)")
    p.add_argument("--participation", type=float, help="fraction of sites per round (0, 1]")
    p.add_argument(
        "--eval-every", type=int, help="evaluate every N rounds; round 0 and the last always (1)"
    )
    p.add_argument("--seed", type=int, help="seed for data, sampling and initialization")
    p.add_argument("--loss", help="auc_margin (default), auc_square, ce (fedavg only)")
    p.add_argument("--num-labels", type=int, help="number of findings (multi-label if > 1)")


def _backend_options(p: argparse.ArgumentParser) -> None:
    """The backend's hyperparameters and the batch floors."""
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


def _weak_site_options(p: argparse.ArgumentParser) -> None:
    """Weak sites (partial training) and personal models."""
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


def _protection_options(p: argparse.ArgumentParser) -> None:
    """Robust aggregation, differential privacy and secure aggregation."""
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
        help="client-side DP: 'update' clips and noises each site's whole update "
        "(default when --dp-clip is given), with a site-level (ε, δ) accountant per site "
        "(replacing one hospital's whole data) and GroupNorm when there is noise; "
        "'example' is DP-SGD: each example's gradient clipped in every local step, with "
        "an example-level (ε, δ) accountant per site and GroupNorm in the model",
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
        help="derive σ so each site spends this ε over the run as its backend plans it "
        "(--dp example: per example, --dp update: per site); with --dp-noise, σ is kept and a "
        "run that would need more ε is refused before round 1; a site whose budget is spent "
        "stops training",
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


def _run_options(p: argparse.ArgumentParser) -> None:
    """The run: resume, warm-up, augmentation, export selection, hold-out, outputs."""
    p.add_argument(
        "--resume",
        metavar="RUN_ID",
        help="continue an interrupted run from its last recorded round (its recorded options)",
    )
    add_data_arguments(p)
    p.add_argument(
        "--experiment",
        help="name of the study this run belongs to, recorded with it (the dashboard's access "
        "file can restrict an experiment's runs to some people)",
    )
    p.add_argument(
        "--warmup-rounds",
        type=int,
        help="fedavg + cross-entropy rounds before the AUC loss (default: 10 for image files "
        "with an AUC loss and no DP accountant, else 0)",
    )
    p.add_argument(
        "--warmup-head",
        choices=WARMUP_HEADS,
        help="the classifier the AUC phase starts from: the warm-up's (keep; default, but "
        "recenter for image files after a warm-up), "
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
    add_compute_arguments(p, "the in-process nodes; a site file's [node] device wins for its site")
    p.add_argument(
        "--init",
        metavar="PATH",
        help="start from these weights: a registered model folder (continue it), or a "
        "state_dict of fed-auc's MONAI DenseNet, torchvision's ImageNet DenseNet121/169/201 or "
        "torchxrayvision's DenseNet121 (.pt/.pth read with weights_only, or .safetensors); "
        "the network and input normalization come from the file",
    )
    p.add_argument("--register", metavar="NAME", help="also copy the model to MODELS_DIR/NAME")
    p.add_argument("--models-dir", default="models", help="model registry folder (models)")
    p.add_argument("--runs-dir", help="where the run store and run folders live (runs)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")


def add_compute_arguments(p: argparse.ArgumentParser, who: str) -> None:
    """``--device`` and ``--precision`` (fed_auc.node.compute); None when not given."""
    p.add_argument(
        "--device",
        help=f"where to compute ({who}): auto (CUDA when usable; default), cpu, cuda or "
        "cuda:N; a CUDA device torch cannot use is an error",
    )
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16", "fp16"],
        help="fp32 (default), or bf16/fp16 autocast for the network (a, b, α and what "
        "travels stay fp32; fp16 with a loss scale)",
    )


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
    """``--config``: the experiment file, every key one of ``fields``."""
    from fed_auc.experiment.files import read_experiment_file

    data = read_experiment_file(path, "simulate")
    unknown = sorted(set(data) - fields)
    if unknown:
        raise SystemExit(
            f"fed-auc: config {path}: unknown key(s) {unknown}; valid keys: {sorted(fields)}"
        )
    return data
