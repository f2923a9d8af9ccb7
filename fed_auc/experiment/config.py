"""The experiment: every option of a federated run, shared by ``fed-auc simulate`` and
``fed-auc coordinator`` and validated before anything starts.

``ExperimentConfig`` is what a run records in the store (``runs.config``); ``recorded_config``
reads it back to resume the run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fed_auc.algorithms import ALGORITHMS, hyperparameter_names
from fed_auc.algorithms.base import DUAL_LR_PREVALENCE
from fed_auc.algorithms.personal import Personalization
from fed_auc.coordinator.local_work import LocalWork
from fed_auc.data.spec import parse_data_spec
from fed_auc.experiment.checks import PREVALENCE_DUAL_STEP, ExperimentChecks, check_type
from fed_auc.node.setup import NodeSetup
from fed_auc.privacy.accounting import RELATIONS
from fed_auc.privacy.dp_sgd import ExampleDP
from fed_auc.privacy.update_dp import UpdateDP
from fed_auc.tta import default_tta

DEFAULT_FILE_SELECT = "best_val:5"
DEFAULT_FILE_NEG_FLOOR = 0.25
# The recipe each kind of data gets for the options not given (None until the kind is known).
# Synthetic: the demo's fast one. Image files: the README's BreastMNIST recipe (a small
# DenseNet, 10 fedavg + CE warm-up rounds before an AUC loss, lr 0.2), which BENCHMARKS.md ran
# on every BreastMNIST federation ("Rare positives", "The README's real-data recipe": CODASCA
# level with FedAvg-CE at 1–2 %, 5 %, 10 % and balanced). Its screens: lr 0.1 lost 0.05
# validation AUC against 0.2, and no warm-up was 0.02 behind 5 rounds (interval holding 0).
SYNTHETIC_RECIPE = {"model": "tiny", "lr": 0.1, "warmup_rounds": 0}
FILE_RECIPE = {"model": "small", "lr": 0.2, "warmup_rounds": 10}


@dataclass
class ExperimentConfig(ExperimentChecks):
    """Every knob of an experiment, for ``fed-auc simulate`` and ``fed-auc coordinator``
    alike. Defaults follow DESIGN.md and the reference code.

    ``transport`` says how the sites run: ``local`` (in-process: the synthetic federation, a
    shared data set split by ``partition``, or the ``site_files`` given) or ``flower`` (each
    node owns its data, so every option that describes a simulated federation is refused).
    Defaults that depend on the kind of data (``model``, ``lr``, ``warmup_rounds``,
    ``warmup_head``, ``select``, ``min_neg_fraction``, ``augment``, ``dual_lr``) are filled in
    when the kind is known: here for ``local``, after the nodes register for ``flower``
    (``with_data_kind``). An option given (flag or TOML key) always wins.
    """

    algorithm: str = "codasca"
    sites: int = 4
    rounds: int = 20
    local_steps: int = 8
    local_steps_range: str | None = None  # "MIN:MAX": τ_i drawn per site and round (seeded)
    site_local_steps: list[int] | None = None  # fixed τ_i per site, in site order
    batch_size: int = 32
    lr: float | None = None  # None: 0.2 for image files, 0.1 for synthetic (*_RECIPE above)
    model: str | None = None  # None: small for image files, tiny for synthetic
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
    # A multi-class .npz column's number of classes (None: binary, 0 or 1); with
    # positive_label, that class against the rest (fed_auc.data.labels.validate_classes).
    classes: int | None = None
    aspect: str = "pad"  # non-square image files: pad / crop / stretch (fed_auc.data.images)
    # Its name in the cards, evaluation files and dashboard, e.g. "malignant" (None: derived,
    # "label == 0" or the label column's name; fed_auc.data.labels.positive_classes).
    positive_class: str | None = None
    # Training tricks for small real data: K rounds of fedavg + cross-entropy first (the
    # min-max backend starts from that model), and export the round with the best pooled
    # validation AUC ("best_val") rather than the last one ("last"), or the mean of the K
    # best ("best_val:K") or last ("last:K") rounds (fed_auc.coordinator.selection).
    # None: best_val:5 for
    # image files (a 78-image validation split picks single rounds noisily, BENCHMARKS.md),
    # best_val for the synthetic demo.
    # None: 10 for image files when the run trains an AUC loss and no DP accountant forbids a
    # warm-up (it would train outside the accountant), else 0.
    warmup_rounds: int | None = None
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
    # the run, and counts each update in its site-level accountant (fed_auc.privacy.update_dp).
    max_update_norm: float | None = None
    aggregation: str = "mean"  # or centered_clip:τ (fed_auc.coordinator.robust)
    dp_clip: float | None = None
    dp_noise: float = 0.0
    # Which DP: None/"update" = the update-level clip and noise above
    # (fed_auc.privacy.update_dp), ε for
    # one whole site's data, GroupNorm in the model when there is noise;
    # "example" = DP-SGD, each example's gradient clipped to dp_clip in every local step and
    # noised with σ = dp_noise, or with the σ that spends target_epsilon at dp_delta over the
    # run (fed_auc.privacy.dp_sgd), an accountant per site, GroupNorm in the model.
    dp: str | None = None
    dp_delta: float = 1e-5
    target_epsilon: float | None = None
    # The network's normalization layers: batch or group (GroupNorm through MONAI's norm
    # option). None: group under dp = 'example' (BatchNorm mixes the examples of a batch) and
    # noised dp = 'update' (BatchNorm's statistics would leave the node un-noised),
    # else batch. Giving group without DP measures what GroupNorm alone costs.
    norm: str | None = None
    # Secure aggregation (fed_auc.privacy.secure, SecAgg+): the coordinator learns only the
    # sums of the sampled sites' masked replies. Each site masks and shares with its
    # `secure_aggregation_neighbours` k neighbours (None: 2⌈log₂ n⌉ of n sampled sites, the full
    # graph up to 7); `secure_aggregation_threshold` of a site's neighbourhood rebuild its
    # secrets (None: a majority of it, at least 2). Refuses options that need single replies.
    secure_aggregation: bool = False
    secure_aggregation_threshold: int | None = None
    secure_aggregation_neighbours: int | None = None
    runs_dir: str = "runs"
    # Where the in-process nodes compute (fed_auc.node.compute): auto (CUDA when usable), cpu,
    # cuda or cuda:N; in fp32, bf16 or fp16 (autocast). A site file's [node] device and
    # precision win for its site; over Flower only the nodes choose.
    device: str = "auto"
    precision: str = "fp32"
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
    # External validation (fed_auc.run.holdout): these sites never train; after training the
    # exported model is scored at every site. [] scores it everywhere with none held out.
    hold_out: list[str] | None = None
    # A name for the study this run belongs to, recorded with the run: the dashboard's access
    # file can show an experiment's runs to some people only (app/access.py).
    experiment: str | None = None
    # Starting weights (fed_auc.registry.init_weights): a registered model's folder, or a
    # state_dict of fed-auc's MONAI DenseNet, torchvision's ImageNet DenseNet or
    # torchxrayvision's; read by the coordinator only, broadcast as round 0's model. The
    # network (`model`, when not given) and its input normalization come from the file.
    init: str | None = None

    def __post_init__(self) -> None:
        if self.loss is None:
            self.loss = "ce" if self.algorithm == "fedavg" else "auc_margin"
        for f in dataclasses.fields(self):
            check_type(f.name, getattr(self, f.name), f.type)
        if self.site_files is not None:
            self.sites = len(self.site_files)
        if self.init is not None:  # absolute: a resume or the ServerApp runs elsewhere
            from pathlib import Path

            if not Path(self.init).exists():
                raise ValueError(f"init: no such file or folder {self.init!r}")
            self.init = str(Path(self.init).resolve())
        if self.init is not None and self.model is None:
            from fed_auc.registry.init_weights import read_init

            self.model = read_init(self.init).arch  # the file's network, not the recipe's
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

    def data_defaults_pending(self) -> bool:
        """Whether options still wait for the data's kind (Flower, before registration)."""
        return None in (self.model, self.lr, self.warmup_rounds)

    def _fill_data_defaults(self, synthetic: bool) -> None:
        recipe = SYNTHETIC_RECIPE if synthetic else FILE_RECIPE
        if self.model is None:
            self.model = recipe["model"]
        if self.lr is None:
            self.lr = recipe["lr"]
        auc_phase = not synthetic and self.loss != "ce"  # the AUC recipe of BENCHMARKS.md
        if self.warmup_rounds is None:
            warm = auc_phase and not self._accounted()
            self.warmup_rounds = recipe["warmup_rounds"] if warm else 0
        if self.select is None:
            self.select = "best_val" if synthetic else DEFAULT_FILE_SELECT
        if self.min_neg_fraction is None:
            self.min_neg_fraction = 0.0 if synthetic else DEFAULT_FILE_NEG_FLOOR
        if self.augment is None:
            self.augment = "none" if synthetic else "flip"
        if self.warmup_head is None:
            self.warmup_head = "recenter" if auc_phase and self.warmup_rounds else "keep"
        if auc_phase and self.algorithm in PREVALENCE_DUAL_STEP:
            self.backend_options = {"dual_lr": DUAL_LR_PREVALENCE, **self.backend_options}

    def _accounted(self) -> bool:
        """Whether a DP accountant runs (DP-SGD, or noised update-level DP): no warm-up then."""
        if self.dp == "example":
            return True
        return self.dp_clip is not None and bool(self.dp_noise or self.target_epsilon is not None)

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
            rounds=self.rounds,
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
