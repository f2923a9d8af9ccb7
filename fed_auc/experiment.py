"""The experiment: every option of a federated run, shared by ``fed-auc simulate`` and
``fed-auc coordinator`` and validated before anything starts.

``ExperimentConfig`` is what a run records in the store (``runs.config``); ``recorded_config``
reads it back to resume the run.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fed_auc.accounting import RELATIONS
from fed_auc.algorithms import ALGORITHMS, build_backend, hyperparameter_names
from fed_auc.algorithms.base import DUAL_LR_PREVALENCE, validate_positive
from fed_auc.data.augment import AUGMENTATIONS
from fed_auc.data.csv_images import UNCERTAIN_POLICIES
from fed_auc.data.labels import validate_positive_class, validate_positive_label
from fed_auc.data.partition import parse_partition
from fed_auc.data.spec import parse_data_spec
from fed_auc.data.synthetic import MAX_SITES as MAX_SYNTHETIC_SITES
from fed_auc.dp_sgd import DP_MODES, ExampleDP
from fed_auc.local_work import LocalWork
from fed_auc.losses import LOSSES
from fed_auc.models import ARCHITECTURES, NORMS
from fed_auc.node_setup import NodeSetup
from fed_auc.partial import parse_budget
from fed_auc.personal import Personalization
from fed_auc.privacy import UpdateDP
from fed_auc.robust import Aggregation
from fed_auc.selection import parse_select
from fed_auc.tta import TTA_MODES, default_tta

DEFAULT_FILE_SELECT = "best_val:5"
DEFAULT_FILE_NEG_FLOOR = 0.25
TRANSPORTS = ("local", "flower")
WARMUP_HEADS = ("keep", "reset", "recenter")  # what the AUC phase starts from (warmup_head)
# Backends whose α step is Backend.dual_lr_of: on image files their dual_lr defaults to
# "prevalence" (η/(p(1−p)); BENCHMARKS.md, "Rare positives": it won on validation).
PREVALENCE_DUAL_STEP = ("codasca", "coda_plus", "local_sgda", "fedavg")
# Options that describe a simulated federation (how many sites, one data set split among
# them, how it is split and shifted): each node owns its data over Flower.
SIMULATED_FEDERATION = (
    "sites", "data", "partition", "data_scale", "feature_shift", "uncertain", "frontal_only",
    "skip_bad_images", "site_memory", "site_local_steps", "site_files", "positive_label",
    "aspect", "positive_class",
)  # fmt: skip


@dataclass
class ExperimentConfig:
    """Every knob of an experiment, for ``fed-auc simulate`` and ``fed-auc coordinator``
    alike. Defaults follow DESIGN.md and the reference code.

    ``transport`` says how the sites run: ``local`` (in-process: the synthetic federation, a
    shared data set split by ``partition``, or the ``site_files`` given) or ``flower`` (each
    node owns its data, so every option that describes a simulated federation is refused).
    Defaults that depend on the kind of data (``select``, ``min_neg_fraction``, ``augment``)
    are filled in when the kind is known: here for ``local``, after the nodes register for
    ``flower`` (``with_data_kind``).
    """

    algorithm: str = "codasca"
    sites: int = 4
    rounds: int = 20
    local_steps: int = 8
    local_steps_range: str | None = None  # "MIN:MAX": τ_i drawn per site and round (seeded)
    site_local_steps: list[int] | None = None  # fixed τ_i per site, in site order
    batch_size: int = 32
    lr: float = 0.1
    model: str = "tiny"
    image_size: int = 28
    participation: float = 1.0
    eval_every: int = 1  # evaluate every N rounds (round 0 and the last always)
    seed: int = 0
    loss: str | None = None  # None: auc_margin, or ce for fedavg
    num_labels: int = 1
    gamma: float = 1 / 500
    eta_g: float = 1.0
    lr_decay: float = 3.0
    decay_every: int = 4000
    weight_decay: float = 1e-5
    grad_clip: float | None = 1.0
    stage_output: str | None = None  # None: the backend's default ("last")
    # Floor of positives per batch: 0.05 = 2 of 32, enough for both classes in every batch.
    # A 20 % floor skews the batches away from the prevalence p the AUC loss assumes: on the
    # demo federation it cost 0.05 pooled and 0.2 worst-site AUC (BENCHMARKS.md).
    min_pos_fraction: float = 0.05
    # Floor of negatives per batch. Label skew can leave a site nearly all positive (BreastMNIST
    # under dirichlet:0.5: 124 benign of 125), so most of its batches would have no negative.
    # None: 0.25 for image files (8 of 32, as LibAUC's DualSampler fixes both classes' counts;
    # chosen on BreastMNIST validation AUC, BENCHMARKS.md), 0 for the synthetic demo, whose
    # positives are the rare class.
    min_neg_fraction: float | None = None
    # Further hyperparameters of the chosen backend, by name (TOML table [backend_options],
    # CLI --backend-option NAME=VALUE); the backend validates them.
    backend_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    data_scale: float = 1.0
    # Data source and partition (fed_auc.data.spec / partition): `synthetic` is the demo
    # federation; file sources are split into `sites` by `partition` (default: natural for
    # CSV with a site column, else iid); the manifest is saved as <run>/partition.json.
    data: str = "synthetic"
    partition: str | None = None
    feature_shift: float = 0.0
    uncertain: str = "zeros"  # CheXpert -1 labels: zeros / ones / ignore
    frontal_only: bool = False
    skip_bad_images: bool = False
    # The label value of a file source that is the positive class (None: the file's 1), e.g.
    # 0 for BreastMNIST, whose 1 is normal/benign and 0 malignant (fed_auc.data.labels).
    positive_label: int | None = None
    aspect: str = "pad"  # non-square image files: pad / crop / stretch (fed_auc.data.images)
    # Its name in the cards, evaluation files and dashboard, e.g. "malignant" (None: derived,
    # "label == 0" or the label column's name; fed_auc.data.labels.positive_classes).
    positive_class: str | None = None
    # Training tricks for small real data: K rounds of fedavg + cross-entropy first (the
    # min-max backend starts from that model), and export the round with the best pooled
    # validation AUC ("best_val") rather than the last one ("last"), or the mean of the K
    # best ("best_val:K") or last ("last:K") rounds (fed_auc.selection). None: best_val:5 for
    # image files (a 78-image validation split picks single rounds noisily, BENCHMARKS.md),
    # best_val for the synthetic demo.
    warmup_rounds: int = 0
    # The classifier (output layer) the AUC phase starts from: the warm-up's as it is
    # ("keep"), set back to its initial values as LibAUC's two-stage recipe does ("reset"), or
    # the warm-up's with each label's bias moved by −logit(p) ("recenter"): the same ranking,
    # but scores near ½ instead of near p, where the AUC loss's gradient, which carries
    # h(1 − h), is not 4–6× smaller than cross-entropy's (BENCHMARKS.md, "Rare positives").
    # None: recenter for image files after a warm-up into an AUC loss, keep otherwise.
    warmup_head: str | None = None
    select: str | None = None
    # Training-time augmentation of each node's batches (fed_auc.data.augment): none, flip or
    # crop_flip. None: flip for image files (few real images overfit fast; on BreastMNIST at
    # 28 px crop_flip underfit in 30 rounds, BENCHMARKS.md), none for the synthetic demo.
    augment: str | None = None
    # Test-time augmentation of every scored split (fed_auc.tta): none or flip. None: flip
    # when training flips the images (a model trained on mirrors scores both alike), else none.
    tta: str | None = None
    # Reliability and privacy: replies whose update (‖v_k − v‖ of iterates, the server step of a
    # gradient reply: Backend.update_norm) exceeds the bound are rejected; with
    # dp_clip, every node clips each block of its update to that norm and adds Gaussian noise
    # of standard deviation dp_noise · dp_clip, or with the σ that spends target_epsilon over
    # the run, and counts each update in its site-level accountant (fed_auc.privacy).
    max_update_norm: float | None = None
    aggregation: str = "mean"  # or centered_clip:τ (fed_auc.robust)
    dp_clip: float | None = None
    dp_noise: float = 0.0
    # Which DP: None/"update" = the update-level clip and noise above (fed_auc.privacy), ε for
    # one whole site's data, GroupNorm in the model when there is noise;
    # "example" = DP-SGD, each example's gradient clipped to dp_clip in every local step and
    # noised with σ = dp_noise, or with the σ that spends target_epsilon at dp_delta over the
    # run (fed_auc.dp_sgd), an accountant per site, GroupNorm in the model.
    dp: str | None = None
    dp_delta: float = 1e-5
    target_epsilon: float | None = None
    # The network's normalization layers: batch or group (GroupNorm through MONAI's norm
    # option). None: group under dp = 'example' (BatchNorm mixes the examples of a batch) and
    # noised dp = 'update' (BatchNorm's statistics would leave the node un-noised),
    # else batch. Giving group without DP measures what GroupNorm alone costs.
    norm: str | None = None
    # Secure aggregation (fed_auc.secure_aggregation, SecAgg+): the coordinator learns only the
    # sums of the sampled sites' masked replies. Each site masks and shares with its
    # `secure_aggregation_neighbours` k neighbours (None: 2⌈log₂ n⌉ of n sampled sites, the full
    # graph up to 7); `secure_aggregation_threshold` of a site's neighbourhood rebuild its
    # secrets (None: a majority of it, at least 2). Refuses options that need single replies.
    secure_aggregation: bool = False
    secure_aggregation_threshold: int | None = None
    secure_aggregation_neighbours: int | None = None
    runs_dir: str = "runs"
    # The sites as files (fed_auc.site): exactly these hospitals, in-process, each with its own
    # data, splits and node settings, as `fed-auc node --site FILE` serves them over Flower.
    site_files: list[str] | None = None
    transport: str = "local"  # local (in-process) or flower (fed-auc coordinator)
    # EmbracingFL: each site trains the output-side suffix its memory budget allows. Budgets
    # per site (fraction of a full step, bytes or "64MiB"); default strong/moderate/weak tiers.
    partial_training: bool = False
    site_memory: list | None = None  # items: float, int or str
    # LSGD-PFL personalization: None, "head" or "l2"; λ for l2; head lr ratio (None = sites)
    personalize: str | None = None
    personal_lambda: float = 1.0
    personal_lr_ratio: float | None = None
    # External validation (fed_auc.holdout): these sites never train; after training the
    # exported model is scored at every site. [] scores it everywhere with none held out.
    hold_out: list[str] | None = None

    def __post_init__(self) -> None:
        if self.loss is None:
            self.loss = "ce" if self.algorithm == "fedavg" else "auc_margin"
        for f in dataclasses.fields(self):
            _check_type(f.name, getattr(self, f.name), f.type)
        if self.site_files is not None:
            self.sites = len(self.site_files)
        synthetic = self.data_is_synthetic()
        if synthetic is not None:
            self._fill_data_defaults(synthetic)
        self.validate()

    def data_is_synthetic(self) -> bool | None:
        """Whether the sites' images are generated; None while unknown (Flower, before the
        nodes register). Site files count as image files unless all of them are synthetic."""
        if self.transport != "local" or not isinstance(self.data, str):
            return None
        if self.site_files is not None:
            from fed_auc.site import load_site_files

            return all(site.synthetic for site in load_site_files(self.site_files))
        return parse_data_spec(self.data).kind == "synthetic"

    def with_data_kind(self, synthetic: bool) -> ExperimentConfig:
        """A copy with the data-dependent defaults filled in (Flower: after registration)."""
        config = dataclasses.replace(self)
        config._fill_data_defaults(synthetic)
        config.validate()
        return config

    def _fill_data_defaults(self, synthetic: bool) -> None:
        if self.select is None:
            self.select = "best_val" if synthetic else DEFAULT_FILE_SELECT
        if self.min_neg_fraction is None:
            self.min_neg_fraction = 0.0 if synthetic else DEFAULT_FILE_NEG_FLOOR
        if self.augment is None:
            self.augment = "none" if synthetic else "flip"
        auc_phase = not synthetic and self.loss != "ce"  # the AUC recipe of BENCHMARKS.md
        if self.warmup_head is None:
            self.warmup_head = "recenter" if auc_phase and self.warmup_rounds else "keep"
        if auc_phase and self.algorithm in PREVALENCE_DUAL_STEP:
            self.backend_options = {"dual_lr": DUAL_LR_PREVALENCE, **self.backend_options}

    def validate(self) -> None:
        """Fail early with the option name, the bad value and what was expected."""
        for f in dataclasses.fields(self):
            _check_type(f.name, getattr(self, f.name), f.type)
        _choice("algorithm", self.algorithm, sorted(ALGORITHMS))
        _choice("loss", self.loss, LOSSES)
        _choice("model", self.model, sorted(ARCHITECTURES))
        if ALGORITHMS[self.algorithm].needs_minimax_loss and self.loss == "ce":
            raise ValueError(
                f"algorithm {self.algorithm!r} is a min-max AUC method: use --loss auc_margin "
                "or auc_square (cross-entropy works with fedavg only)"
            )
        _choice("transport", self.transport, TRANSPORTS)
        self._check_sites_option()
        synthetic = parse_data_spec(self.data).kind == "synthetic"
        _at_least("sites", self.sites, 1, MAX_SYNTHETIC_SITES if synthetic else None)
        if self.partition is not None:
            parse_partition(self.partition)
        _choice("uncertain", self.uncertain, list(UNCERTAIN_POLICIES))
        _choice("aspect", self.aspect, ["pad", "crop", "stretch"])
        validate_positive_label(self.positive_label)
        validate_positive_class(self.positive_class)
        if synthetic and self.positive_class is not None:
            raise ValueError(
                f"positive_class {self.positive_class!r} names a file source's positive class; "
                "the synthetic federation's positives are its findings"
            )
        if synthetic and self.positive_label is not None:
            raise ValueError(
                f"positive_label {self.positive_label!r} applies to file sources (--data "
                "medmnist:PATH or csv:PATH); the synthetic federation's positives are its findings"
            )
        parse_select(self.select or "best_val")
        if self.augment is not None:
            _choice("augment", self.augment, list(AUGMENTATIONS))
        if self.tta is not None:
            _choice("tta", self.tta, list(TTA_MODES))
        _at_least("warmup_rounds", self.warmup_rounds, 0)
        if self.warmup_head is not None:
            _choice("warmup_head", self.warmup_head, WARMUP_HEADS)
        if self.warmup_head not in (None, "keep") and not self.warmup_rounds:
            raise ValueError(
                f"warmup_head = {self.warmup_head!r} needs warmup_rounds ≥ 1 (a warm-up whose "
                "classifier to change)"
            )
        if not (math.isfinite(self.feature_shift) and self.feature_shift >= 0):
            raise ValueError(f"feature_shift must be >= 0, got {self.feature_shift!r}")
        _at_least("rounds", self.rounds, 1)
        _at_least("eval_every", self.eval_every, 1)
        _at_least("local_steps", self.local_steps, 1)
        _at_least("batch_size", self.batch_size, 2)
        _at_least("image_size", self.image_size, 16, 512)
        _at_least("num_labels", self.num_labels, 1, 5)
        if not 0 < self.participation <= 1:
            raise ValueError(f"participation must be in (0, 1], got {self.participation!r}")
        if not 0 <= self.min_pos_fraction < 1:
            raise ValueError(f"min_pos_fraction must be in [0, 1), got {self.min_pos_fraction!r}")
        if self.min_neg_fraction is not None and not 0 <= self.min_neg_fraction < 1:
            raise ValueError(f"min_neg_fraction must be in [0, 1), got {self.min_neg_fraction!r}")
        floors = math.ceil(self.min_pos_fraction * self.batch_size) + math.ceil(
            (self.min_neg_fraction or 0) * self.batch_size
        )
        if floors > self.batch_size:
            raise ValueError(
                f"min_pos_fraction {self.min_pos_fraction!r} and min_neg_fraction "
                f"{self.min_neg_fraction!r} floor {floors} rows of a batch of {self.batch_size}"
            )
        if not (math.isfinite(self.data_scale) and self.data_scale > 0):
            raise ValueError(f"data_scale must be > 0, got {self.data_scale!r}")
        if self.site_local_steps is not None and len(self.site_local_steps) != self.sites:
            raise ValueError(
                f"site_local_steps needs one value per site ({self.sites}), "
                f"got {self.site_local_steps!r}"
            )
        if self.site_local_steps is not None and self.local_steps_range is not None:
            raise ValueError("give site_local_steps or local_steps_range, not both")
        self.local_work([f"site{i}" for i in range(self.sites)])  # parses the range
        Aggregation.parse(self.aggregation)
        if self.max_update_norm is not None:
            validate_positive("max_update_norm", self.max_update_norm)
        self._check_dp()
        if self.site_memory is not None and not self.partial_training:
            raise ValueError("site_memory needs partial_training (--partial-training)")
        for i, budget in enumerate(self.memory_budgets()):
            if budget is not None:
                parse_budget(budget, f"site_memory[{i}]")
        if self.site_memory is not None and len(self.site_memory) != self.sites:
            raise ValueError(
                f"site_memory needs one budget per site ({self.sites}), got {self.site_memory!r}"
            )
        personalization = self.personalization()
        if personalization is not None:
            personalization.check_backend(
                build_backend(self.algorithm, **self.backend_hyperparameters())
            )
        backend = build_backend(self.algorithm, **self.backend_hyperparameters())  # validates
        Aggregation.parse(self.aggregation).check_backend(backend)
        if self.dp != "example" and self.dp_clip is not None and backend.refuses_update_dp:
            raise ValueError(
                f"dp_clip cannot be used with {self.algorithm!r}: {backend.refuses_update_dp}"
            )
        self._check_secure_aggregation(backend)

    def _check_secure_aggregation(self, backend) -> None:
        """Refuse, by name and with the reason, what secure aggregation cannot do."""
        if not self.secure_aggregation:
            for name in ("secure_aggregation_threshold", "secure_aggregation_neighbours"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} needs secure_aggregation")
            return
        try:
            from fed_auc.secure_aggregation.rounds import SecureAggregation, refuse_options
        except ImportError as exc:
            raise ValueError(
                f"secure_aggregation needs the cryptography and flwr packages ({exc}): "
                "pip install 'fed-auc[secure-aggregation]'"
            ) from None

        settings = SecureAggregation(
            self.secure_aggregation_threshold, self.secure_aggregation_neighbours
        )
        refuse_options(self.aggregation, self.max_update_norm, backend)
        if self.transport != "local":
            return  # the sites are known once they register (the coordinator checks)
        phases = [backend.phase_participation(p) or self.participation for p in backend.phases]
        for sampled in sorted({max(1, math.ceil(f * self.sites)) for f in phases}):
            if sampled < 2:
                raise ValueError(
                    f"secure_aggregation needs at least 2 sampled sites: {sampled} of "
                    f"{self.sites} sites are sampled (participation {self.participation})"
                )
            try:
                k = settings.neighbours_for([""] * sampled)
            except RuntimeError as exc:  # SecureAggregationError, loaded only with the option
                raise ValueError(str(exc)) from None
            threshold = settings.threshold_for([""] * sampled)
            if threshold > k + 1:
                raise ValueError(
                    f"secure_aggregation_threshold {threshold} is larger than a site's "
                    f"neighbourhood: itself and {k} neighbours of the {sampled} sampled sites "
                    f"({self.sites} sites, participation {self.participation})"
                )

    def _check_dp(self) -> None:
        if self.dp is not None:
            _choice("dp", self.dp, DP_MODES)
        if self.norm is not None:
            _choice("norm", self.norm, NORMS)
        if self.dp == "example" and self.norm == "batch":
            raise ValueError(
                "norm = 'batch' cannot be used with dp = 'example': BatchNorm mixes the examples "
                "of a batch, so no gradient is one example's; use norm = 'group'"
            )
        if self.dp == "example":
            if self.dp_clip is None:
                raise ValueError("dp = 'example' needs dp_clip (C, each example's clip norm)")
            self.example_dp()  # validates dp_clip, dp_noise / target_epsilon and dp_delta
            if self.warmup_rounds:
                raise ValueError(
                    f"warmup_rounds = {self.warmup_rounds}: the warm-up trains on site data "
                    "outside the run's DP accountant; set it to 0 with dp = 'example'"
                )
            return
        if self.dp_clip is None:
            if self.dp == "update":
                raise ValueError("dp = 'update' needs dp_clip (C, the update's clip norm)")
            if self.dp_noise:
                raise ValueError("dp_noise needs dp_clip (the noise is σ · C)")
            if self.target_epsilon is not None:
                raise ValueError(
                    f"target_epsilon = {self.target_epsilon!r} needs dp_clip (dp = 'update' or "
                    "'example')"
                )
            return
        if not self.update_dp().accounted:  # validates dp_clip, dp_noise / target_epsilon, δ
            return  # clipping only: no noise, no ε
        if self.norm == "batch":
            raise ValueError(
                "norm = 'batch' cannot be used with dp = 'update' and noise: BatchNorm's running "
                "statistics leave the node un-noised, outside the accountant; use norm = 'group'"
            )
        if self.warmup_rounds:
            raise ValueError(
                f"warmup_rounds = {self.warmup_rounds}: the warm-up trains on site data "
                "outside the run's DP accountant; set it to 0 with dp = 'update' and noise"
            )

    def example_dp(self) -> ExampleDP | None:
        """DP-SGD's settings (dp = 'example'), planned for every round's local steps."""
        if self.dp != "example":
            return None
        steps = max([self.local_steps, *(self.site_local_steps or [])])
        if self.local_steps_range is not None:
            steps = max(steps, int(self.local_steps_range.split(":")[-1]))
        return ExampleDP(
            clip=self.dp_clip,
            noise_multiplier=self.dp_noise or None,
            delta=self.dp_delta,
            target_epsilon=self.target_epsilon,
            rounds=self.rounds,
            local_steps=steps,
        )

    def update_dp(self) -> UpdateDP | None:
        """Update-level DP's settings (dp_clip without dp = 'example'), planned for every
        round's phases (``PrivateUpdates``): a site may take part in all of them."""
        if self.dp == "example" or self.dp_clip is None:
            return None
        return UpdateDP(
            clip=self.dp_clip,
            noise_multiplier=self.dp_noise,
            delta=self.dp_delta,
            target_epsilon=self.target_epsilon,
            rounds=self.rounds,
        )

    def dp_relation(self) -> str | None:
        """The neighbouring relation this run's ε is for (None: no ε is accounted)."""
        if self.dp == "example":
            return RELATIONS["example"]
        update = self.update_dp()
        return RELATIONS["update"] if update is not None and update.accounted else None

    def model_norm(self) -> str:
        """The network's normalization: GroupNorm under DP-SGD (BatchNorm mixes examples) and
        under noised update-level DP (BatchNorm's statistics would leave un-noised)."""
        if self.norm is not None:
            return self.norm
        update = self.update_dp()
        private = self.dp == "example" or (update is not None and update.accounted)
        return "group" if private else "batch"

    def _check_sites_option(self) -> None:
        """Options that describe a simulated federation: refused where sites own their data."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        simulated = [
            name
            for name in SIMULATED_FEDERATION
            if name != "sites" and getattr(self, name) != defaults[name]
        ]
        if self.transport == "flower":
            simulated += ["sites"] if self.sites != defaults["sites"] else []
            if simulated:
                raise ValueError(
                    f"{sorted(simulated)} describe a simulated federation; over Flower each "
                    "node owns its data (its site file): remove them"
                )
            return
        if self.site_files is None:
            return
        if not isinstance(self.site_files, list) or not self.site_files:
            raise ValueError(
                f"site_files must be a non-empty list of paths, got {self.site_files!r}"
            )
        clash = [name for name in simulated if name not in ("data_scale", "site_files")]
        if clash:
            raise ValueError(
                f"site_files define each site's data and node; {sorted(clash)} cannot be "
                "given with them (set them in the site files)"
            )

    def backend_hyperparameters(self) -> dict[str, Any]:
        common = {
            "lr": self.lr,
            "local_steps": self.local_steps,
            "lr_decay": self.lr_decay,
            "decay_every": self.decay_every,
            "weight_decay": self.weight_decay,
            "grad_clip": self.grad_clip,
        }
        accepted = hyperparameter_names(ALGORITHMS[self.algorithm])
        specific = {"gamma": self.gamma, "eta_g": self.eta_g, "seed": self.seed}
        common.update({k: v for k, v in specific.items() if k in accepted})
        if self.stage_output is not None:  # refused by backends without stages
            common["stage_output"] = self.stage_output
        return {**common, **self.backend_options}

    def augmentation(self) -> str:
        """The augmentation in effect (filled in with the data's default once it is known)."""
        if self.augment is None:
            raise ValueError("augment is not known before the data's kind (with_data_kind)")
        return self.augment

    def test_time_augmentation(self) -> str:
        """The TTA in effect: the chosen one, or flip when the training batches are flipped."""
        return default_tta(self.augmentation()) if self.tta is None else self.tta

    def memory_budgets(self) -> list[float | int | str | None]:
        """Per-site budgets: given, or strong (full), moderate (40 %) and weak (15 %) sites."""
        if not self.partial_training:
            return [None] * self.sites
        if self.site_memory is not None:
            return list(self.site_memory)
        tier = self.sites // 3
        return [1.0] * (self.sites - 2 * tier) + [0.4] * tier + [0.15] * tier

    def personalization(self, num_sites: int | None = None) -> Personalization | None:
        """LSGD-PFL's setting; the head's lr ratio defaults to the number of sites M."""
        if self.personalize is None:
            return None
        ratio = self.personal_lr_ratio
        if ratio is None:
            ratio = self.sites if num_sites is None else num_sites
        return Personalization(self.personalize, self.personal_lambda, ratio)

    def node_setup(
        self, run_id: str, model_config: dict[str, Any], num_labels: int, num_sites: int
    ) -> NodeSetup:
        """What every node of this experiment needs (JSON-able, sent with each Flower request)."""
        personalization = self.personalization(num_sites)
        example, update = self.example_dp(), self.update_dp()
        return NodeSetup(
            run_id=run_id,
            algorithm=self.algorithm,
            hyperparameters=self.backend_hyperparameters(),
            model_config=model_config,
            loss=self.loss,
            batch_size=self.batch_size,
            min_pos_fraction=self.min_pos_fraction,
            min_neg_fraction=self.min_neg_fraction,
            augment=self.augmentation(),
            tta=self.test_time_augmentation(),
            seed=self.seed,
            image_size=self.image_size,
            num_labels=num_labels,
            data_scale=self.data_scale,
            update_dp=dataclasses.asdict(update) if update else None,
            example_dp=dataclasses.asdict(example) if example else None,
            partial_training=self.partial_training,
            personalize=self.personalize,
            personal_lambda=self.personal_lambda,
            personal_lr_ratio=personalization.lr_ratio if personalization else 1.0,
        )

    def local_work(
        self, site_names: list[str], fixed: dict[str, int] | None = None
    ) -> LocalWork | None:
        """Per-site τ_i, or None when every site does the backend's ``local_steps``.
        ``fixed``: sites whose own file sets their τ_i (they keep it whatever the range)."""
        fixed = dict(fixed or {})
        if self.site_local_steps is not None:
            fixed.update(zip(site_names, self.site_local_steps, strict=True))
        if self.local_steps_range is not None:
            work = LocalWork.from_range(self.local_steps_range, seed=self.seed)
            return dataclasses.replace(work, fixed=fixed)
        return LocalWork(fixed=fixed) if fixed else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _choice(name: str, value: Any, choices: list[str] | tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "list[int]": (list,),
    "list[str]": (list,),
    "list": (list,),  # checked item by item by the option's own validation
    "dict[str, Any]": (dict,),
}


def _check_type(name: str, value: Any, annotation: str) -> None:
    """``value`` matches a field annotation such as ``float | None`` (bool is not a number)."""
    kinds = [kind.strip() for kind in str(annotation).split("|")]
    if value is None:
        if "None" in kinds:
            return
    elif any(
        isinstance(value, _TYPES[kind]) and (kind == "bool" or not isinstance(value, bool))
        for kind in kinds
        if kind in _TYPES
    ):
        if "list[int]" not in kinds or all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            return
    raise ValueError(f"{name} must be {annotation}, got {value!r} ({type(value).__name__})")


def _at_least(name: str, value: Any, low: int, high: int | None = None) -> None:
    if not isinstance(value, int) or value < low or (high is not None and value > high):
        upper = f" and ≤ {high}" if high is not None else ""
        raise ValueError(f"{name} must be an integer ≥ {low}{upper}, got {value!r}")


def recorded_config(recorded: dict[str, Any], runs_dir: str | Path) -> ExperimentConfig:
    """The config a run was recorded with; options added to fed-auc since then take the value
    that reproduces how it trained (a run recorded before the negative floor had none)."""
    recorded = dict(recorded)
    # What the run recorded about its data (fed_auc.data.cards.data_record) describes what it
    # ran on, not options: the sites' data, their number and site files come from the nodes
    # over Flower, from the site files in-process.
    recorded.pop("site_data", None)
    if recorded.get("transport") == "flower":
        for key in ("data", "sites", "site_files"):
            recorded.pop(key, None)
    elif recorded.get("site_files"):
        recorded.pop("data", None)
    return ExperimentConfig(**{"min_neg_fraction": 0.0, **recorded, "runs_dir": str(runs_dir)})
