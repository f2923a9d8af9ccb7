"""The options that say how each site trains: the network, the loss, the backend's
hyperparameters, the batch floors, and the real-data recipe (warm-up, augmentation, the exported
round). Defaults that depend on the kind of data (None here) are filled in by
``ExperimentConfig`` once the kind is known (``SYNTHETIC_RECIPE`` and ``FILE_RECIPE``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fed_auc.coordinator.selection import parse_select
from fed_auc.data.augment import AUGMENTATIONS
from fed_auc.experiment.kinds import Integer, Interval, OneOf, Parsed
from fed_auc.experiment.option import option
from fed_auc.losses import LOSSES
from fed_auc.models import ARCHITECTURES
from fed_auc.tta import TTA_MODES

WARMUP_HEADS = ("keep", "reset", "recenter")  # what the AUC phase starts from (warmup_head)


def parse_backend_option(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` with VALUE read as TOML (numbers, booleans, quoted strings) or a string."""
    import tomllib

    name, sep, raw = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"--backend-option must look like NAME=VALUE, got {text!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return name.strip(), value


@dataclass
class TrainingOptions:
    """How each site trains, and the recipe the real data gets."""

    batch_size: int = option(32, help="local mini-batch size", group="training", check=Integer(2))
    lr: float | None = option(
        None,
        help="local step size η (primal and dual); ÷ lr_decay every --decay-every steps",
        group="training",
        check=Interval(0, closed="(]"),
        doc="local step size η (primal and dual); ÷ `lr_decay` every `--decay-every` steps. The "
        "real-data recipe's 0.2: on BreastMNIST lr 0.1 lost 0.05 validation AUC against 0.2 "
        '(BENCHMARKS.md, "Rare positives"); the demo keeps its fast 0.1',
        default_doc="0.2 for image files, 0.1 for synthetic",
    )
    model: str | None = option(
        None,
        help="the network (MONAI DenseNet, 1 channel)",
        group="training",
        check=OneOf(lambda: sorted(ARCHITECTURES)),
        doc="the network (MONAI DenseNet, 1 channel); `small` is 32 init features, growth 16, "
        "blocks 4-4-4: ~3× tiny's CPU time",
        default_doc="`small` for image files, `tiny` for synthetic (the real-data recipe); "
        "with `--init`, the file's network",
    )
    image_size: int = option(
        28,
        help="image side in pixels (under 32 px is resized up inside the model)",
        group="training",
        check=Integer(16, 512),
    )
    eval_every: int = option(
        1,
        help="evaluate every N rounds; round 0 and the last always, rounds between record no AUC",
        group="training",
        check=Integer(1),
    )
    loss: str | None = option(
        None,
        help="the loss (auc_square: CODASCA paper eq. 2; ce: cross-entropy, fedavg only)",
        group="training",
        check=OneOf(LOSSES),
        default_doc="`auc_margin`, `ce` for fedavg",
    )
    num_labels: int = option(
        1,
        help="findings per image (multi-label keeps one a, b, α per label)",
        group="training",
        check=Integer(1, 5),
    )
    # The backend's own hyperparameters: the backend checks them (fed_auc.algorithms.base).
    gamma: float = option(
        1 / 500,
        help="proximal weight γ of CODA+/CODASCA's stage subproblem",
        group="training",
        default_doc="1/500",
    )
    eta_g: float = option(1.0, help="CODASCA's server step η_g", group="training")
    lr_decay: float = option(
        3.0, help="the lr is divided by this every --decay-every steps", group="training"
    )
    decay_every: int = option(4000, help="T0, local steps per stage", group="training")
    weight_decay: float = option(1e-5, help="L2 weight decay of the network", group="training")
    grad_clip: float | None = option(
        1.0,
        help="clip of each local step's gradient norm (config file: omit for none)",
        group="training",
    )
    stage_output: str | None = option(
        None,
        help="CODA+/CODASCA stage output: last, or the paper's average (coda_plus) / "
        "random_round (codasca)",
        group="training",
        default_doc="`last`",
    )
    # Floor of positives per batch: 0.05 = 2 of 32, enough for both classes in every batch.
    # A 20 % floor skews the batches away from the prevalence p the AUC loss assumes: on the
    # demo federation it cost 0.05 pooled and 0.2 worst-site AUC (BENCHMARKS.md).
    min_pos_fraction: float = option(
        0.05,
        help="floor of positives per batch",
        group="training",
        check=Interval(0, 1, "[)"),
        doc="positives over-sampled to at least this share of each batch, so every batch has "
        "both classes; the batch's rows are weighted back so the AUC loss still sees the "
        "data's prevalence (cross-entropy trains on the batch as drawn)",
    )
    # Label skew can leave a site nearly all positive (BreastMNIST under dirichlet:0.5: 124
    # benign of 125), so most of its batches would have no negative; 8 of 32 as LibAUC's
    # DualSampler fixes both classes' counts (chosen on BreastMNIST validation AUC).
    min_neg_fraction: float | None = option(
        None,
        help="floor of negatives per batch",
        group="training",
        check=Interval(0, 1, "[)"),
        doc="negatives over-sampled to at least this share of each batch: a site that label "
        "skew left nearly all positive still trains on both classes (LibAUC's `DualSampler` "
        "fixes both counts)",
        default_doc="0.25 for image files, 0 for synthetic",
    )
    backend_options: dict[str, Any] = option(
        factory=dict,
        help="a further hyperparameter of the backend (repeatable), e.g. server_lr=0.5",
        group="training",
        flag="--backend-option",
        metavar="NAME=VALUE",
        parse=parse_backend_option,
        repeat=True,
        doc="`NAME=VALUE`, a further hyperparameter of the backend (repeatable; config file: "
        "the table `[backend_options]`); the backend checks it",
    )
    init: str | None = option(
        None,
        help="start from these weights: a registered model folder (continue it), or a "
        "state_dict of fed-auc's MONAI DenseNet, torchvision's ImageNet DenseNet121/169/201 or "
        "torchxrayvision's DenseNet121 (.pt/.pth read with weights_only, or .safetensors); "
        "the network and input normalization come from the file",
        group="training",
        metavar="PATH",
        doc="start from these weights: a registered model folder, or a state_dict of fed-auc's "
        "DenseNet, torchvision's ImageNet DenseNet121/169/201 or torchxrayvision's "
        "DenseNet121; read by the coordinator only and broadcast as round 0's model; the "
        "network and input normalization come from the file (relative to the config file "
        "in a config file)",
    )
    # K rounds of fedavg + cross-entropy first; the min-max backend starts from that model.
    warmup_rounds: int | None = option(
        None,
        help="fedavg + cross-entropy rounds before the AUC loss",
        group="recipe",
        check=Integer(0),
        doc="K rounds of fedavg + cross-entropy first; the chosen backend starts from that "
        "model. The recipe's 10: the AUC loss from the start was 0.02 behind on validation, "
        'its interval holding 0 (BENCHMARKS.md, "Rare positives"). None under a DP '
        "accountant (`--dp example`, noised `--dp update`): the warm-up would train outside it",
        default_doc="10 for image files when the run trains an AUC loss without a DP "
        "accountant, else 0",
    )
    warmup_head: str | None = option(
        None,
        help="the classifier the AUC phase starts from: the warm-up's (keep), re-initialized "
        "(reset, LibAUC's recipe) or with its bias moved by −logit(p) (recenter: the same "
        "ranking, scores near ½)",
        group="recipe",
        check=OneOf(WARMUP_HEADS),
        doc="the classifier the AUC phase starts from: the warm-up's (`keep`), re-initialized "
        "as LibAUC's two-stage recipe does (`reset`), or with each label's bias moved by "
        "−logit(p) (`recenter`: the same ranking, scores near ½ where the AUC loss's "
        "gradient, which carries h(1 − h), is not 4–6× smaller than cross-entropy's; "
        'BENCHMARKS.md, "Rare positives")',
        default_doc="`recenter` for image files after a warm-up into an AUC loss, else `keep`",
    )
    early_stop: int | None = option(
        None,
        help="end the rounds once pooled validation AUC has not improved for N evaluations "
        "(the warm-up's and --init's models count as the best so far; 0: never)",
        group="recipe",
        check=Integer(0),
        metavar="N",
        doc="end the run's rounds once pooled validation AUC has not improved for N "
        "evaluations; the best so far includes the warm-up's rounds and the `--init` model, "
        "so an AUC phase that only moves away from its warm-up stops after N evaluations "
        "(the export then takes the warm-up's model). The card, the summary and the run's "
        "events say after which round and why; `0` never stops early",
        default_doc="10 for image files, 0 (off) for synthetic",
    )
    select: str | None = option(
        None,
        help="the exported model: best_val (the round with the best validation AUC), last, or "
        "the mean of the K best (best_val:K) or last (last:K) rounds",
        group="recipe",
        check=Parsed(parse_select, "best_val, last, best_val:K or last:K"),
        doc="the exported model: `best_val` (round with the best pooled validation AUC), "
        "`last`, or the mean of the weights of the K best-validation rounds (`best_val:K`) or "
        "of the last K rounds (`last:K`); an average is scored by every site after the last "
        "round and its card lists the rounds. The rounds it chooses from are the whole run's: "
        "the warm-up's fedavg + CE rounds and, with `--init`, round 0 are candidates, so an "
        "AUC phase that never beats its warm-up on validation exports the warm-up's model, "
        "and the card's `selected` names the stage, algorithm and loss that trained it. The "
        "recipe's `best_val:5`: a 78-image validation split picks single rounds noisily "
        "(BENCHMARKS.md)",
        default_doc="`best_val:5` for image files, `best_val` for synthetic",
    )
    augment: str | None = option(
        None,
        help="training-time augmentation of each node's batches",
        group="recipe",
        check=OneOf(AUGMENTATIONS),
        doc="training-time augmentation of each node's batches: `flip` (left-right, p = ½), "
        "`crop_flip` (shift up to ⅛ of the side, zero-padded, then flip); seeded, never at "
        "evaluation (on BreastMNIST at 28 px crop_flip underfit in 30 rounds, BENCHMARKS.md)",
        default_doc="`flip` for image files, `none` for synthetic",
    )
    tta: str | None = option(
        None,
        help="test-time augmentation when scoring (flip: the mean of the image's and its "
        "mirror's score)",
        group="recipe",
        check=OneOf(TTA_MODES),
        doc="test-time augmentation wherever the model is scored (validation, which picks the "
        "exported round; test; the card's threshold; `fed-auc evaluate`, which reads it from "
        "the model card): `flip` is the mean of the image's and its mirror's score",
        default_doc="`flip` when training flips, else `none`",
    )
