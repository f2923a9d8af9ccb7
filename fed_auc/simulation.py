"""A whole federation on one machine: synthetic sites, in-process nodes, one coordinator.

``SimulationConfig`` is everything ``fed-auc simulate`` accepts, validated up front;
``run_simulation`` builds the parts, runs the rounds, records them and exports the model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from fed_auc.algorithms import ALGORITHMS, build_backend, hyperparameter_names
from fed_auc.algorithms.base import validate_positive
from fed_auc.coordinator import Coordinator
from fed_auc.data.augment import AUGMENTATIONS
from fed_auc.data.base import SiteData
from fed_auc.data.cards import data_card
from fed_auc.data.csv_images import UNCERTAIN_POLICIES
from fed_auc.data.partition import parse_partition
from fed_auc.data.spec import load_sites, parse_data_spec
from fed_auc.data.synthetic import MAX_SITES as MAX_SYNTHETIC_SITES
from fed_auc.evaluate import youden_threshold
from fed_auc.export import export_model
from fed_auc.io import save_json
from fed_auc.local_work import LocalWork
from fed_auc.losses import LOSSES, build_loss
from fed_auc.models import ARCHITECTURES, DenseNetClassifier, build_model, model_from_config
from fed_auc.node import Node
from fed_auc.partial import parse_budget
from fed_auc.personal import Personalization
from fed_auc.privacy import Privacy
from fed_auc.robust import Aggregation
from fed_auc.selection import BestModel, parse_select, track_best_model
from fed_auc.store import RoundRecord, RunStore
from fed_auc.trainable import BUFFER, WEIGHT, Trainable
from fed_auc.transport.local import LocalTransport
from fed_auc.tta import TTA_MODES, default_tta

PARTITION_FILE = "partition.json"
DEFAULT_FILE_SELECT = "best_val:5"
DEFAULT_FILE_NEG_FLOOR = 0.25
STATE_IN_MEMORY_UP_TO = 16  # sites whose node local state stays in memory between rounds


@dataclass
class SimulationConfig:
    """Every knob of a simulated run. Defaults follow DESIGN.md and the reference code."""

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
    # Training tricks for small real data: K rounds of fedavg + cross-entropy first (the
    # min-max backend starts from that model), and export the round with the best pooled
    # validation AUC ("best_val") rather than the last one ("last"), or the mean of the K
    # best ("best_val:K") or last ("last:K") rounds (fed_auc.selection). None: best_val:5 for
    # image files (a 78-image validation split picks single rounds noisily, BENCHMARKS.md),
    # best_val for the synthetic demo.
    warmup_rounds: int = 0
    select: str | None = None
    # Training-time augmentation of each node's batches (fed_auc.data.augment): none, flip or
    # crop_flip. None: flip for image files (few real images overfit fast; on BreastMNIST at
    # 28 px crop_flip underfit in 30 rounds, BENCHMARKS.md), none for the synthetic demo.
    augment: str | None = None
    # Test-time augmentation of every scored split (fed_auc.tta): none or flip. None: flip
    # when training flips the images (a model trained on mirrors scores both alike), else none.
    tta: str | None = None
    # Reliability and privacy: replies whose ‖w_k − w‖ exceeds the bound are rejected; with
    # dp_clip, every node clips each block of its update to that norm and adds Gaussian noise
    # of standard deviation dp_noise · dp_clip (fed_auc.privacy).
    max_update_norm: float | None = None
    aggregation: str = "mean"  # or median, trimmed_mean[:β] (fed_auc.robust)
    dp_clip: float | None = None
    dp_noise: float = 0.0
    runs_dir: str = "runs"
    # EmbracingFL: each site trains the output-side suffix its memory budget allows. Budgets
    # per site (fraction of a full step, bytes or "64MiB"); default strong/moderate/weak tiers.
    partial_training: bool = False
    site_memory: list | None = None  # items: float, int or str
    # LSGD-PFL personalization: None, "head" or "l2"; λ for l2; head lr ratio (None = sites)
    personalize: str | None = None
    personal_lambda: float = 1.0
    personal_lr_ratio: float | None = None

    def __post_init__(self) -> None:
        if self.loss is None:
            self.loss = "ce" if self.algorithm == "fedavg" else "auc_margin"
        if self.select is None and isinstance(self.data, str):
            synthetic = parse_data_spec(self.data).kind == "synthetic"
            self.select = "best_val" if synthetic else DEFAULT_FILE_SELECT
        if self.min_neg_fraction is None and isinstance(self.data, str):
            synthetic = parse_data_spec(self.data).kind == "synthetic"
            self.min_neg_fraction = 0.0 if synthetic else DEFAULT_FILE_NEG_FLOOR
        self.validate()

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
        synthetic = parse_data_spec(self.data).kind == "synthetic"
        _at_least("sites", self.sites, 1, MAX_SYNTHETIC_SITES if synthetic else None)
        if self.partition is not None:
            parse_partition(self.partition)
        _choice("uncertain", self.uncertain, list(UNCERTAIN_POLICIES))
        parse_select(self.select or "")
        _choice("augment", self.augmentation(), list(AUGMENTATIONS))
        _choice("tta", self.test_time_augmentation(), list(TTA_MODES))
        _at_least("warmup_rounds", self.warmup_rounds, 0)
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
        if self.dp_clip is not None:
            Privacy(self.dp_clip, self.dp_noise)  # validates both
        elif self.dp_noise:
            raise ValueError("dp_noise needs dp_clip (the noise is σ · C)")
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
        build_backend(self.algorithm, **self.backend_hyperparameters())  # validates them

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
        """The augmentation in effect: the chosen one, or the default for the data source."""
        if self.augment is not None:
            return self.augment
        return "none" if parse_data_spec(self.data).kind == "synthetic" else "flip"

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

    def personalization(self) -> Personalization | None:
        if self.personalize is None:
            return None
        ratio = self.sites if self.personal_lr_ratio is None else self.personal_lr_ratio
        return Personalization(self.personalize, self.personal_lambda, ratio)

    def local_work(self, site_names: list[str]) -> LocalWork | None:
        """Per-site τ_i, or None when every site does the backend's ``local_steps``."""
        if self.local_steps_range is not None:
            return LocalWork.from_range(self.local_steps_range, seed=self.seed)
        if self.site_local_steps is not None:
            return LocalWork(fixed=dict(zip(site_names, self.site_local_steps, strict=True)))
        return None

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


def git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


@dataclass
class Federation:
    """The assembled parts of a simulated run, ready for ``coordinator.run``."""

    config: SimulationConfig
    sites: list[SiteData]
    coordinator: Coordinator
    store: RunStore
    run_id: str
    run_dir: Path
    model_config: dict[str, Any]


def build_federation(config: SimulationConfig, run_id: str | None = None) -> Federation:
    """The sites (``config.data`` split by ``config.partition``), one in-process node each,
    a coordinator (after the optional warm-up), and a run in the store: a new one, or the
    existing ``run_id``, resumed from its last recorded round."""
    torch.manual_seed(config.seed)
    sites, manifest = load_sites(
        config.data,
        config.partition,
        config.sites,
        config.seed,
        config.image_size,
        num_labels=config.num_labels,
        data_scale=config.data_scale,
        feature_shift=config.feature_shift,
        uncertain=config.uncertain,
        frontal_only=config.frontal_only,
        skip_bad_images=config.skip_bad_images,
    )
    num_labels = sites[0].num_labels
    backend = build_backend(config.algorithm, **config.backend_hyperparameters())
    model = build_model(config.model, num_labels=num_labels)
    server = Trainable(model, build_loss(config.loss, num_labels, [0.5] * num_labels))
    store = RunStore(config.runs_dir)
    resuming = run_id is not None
    if run_id is None:
        run_id = store.create_run(config.algorithm, config.to_dict(), git_revision())
    run_dir = Path(config.runs_dir) / run_id
    personalization = config.personalization()
    if manifest is not None:
        save_json(manifest, run_dir / PARTITION_FILE)
    started = resuming and not store.rounds(run_id).empty
    try:
        if config.warmup_rounds and not started:
            server.load(warm_start(config, sites, model, store, run_id, run_dir))
        coordinator = Coordinator(
            backend,
            LocalTransport(_nodes(config, sites, backend, model.config(), config.loss, run_dir)),
            store,
            run_id,
            run_dir,
            server,
            participation=config.participation,
            seed=config.seed,
            local_work=config.local_work([site.name for site in sites]),
            personal=personalization.personal_names(server.names()) if personalization else (),
            max_update_norm=config.max_update_norm,
            aggregation=Aggregation.parse(config.aggregation),
            eval_every=config.eval_every,
        )
        if resuming:
            last = coordinator.resume()
            store.reopen_run(run_id, f"run resumed after round {last}")
    except BaseException as exc:
        _fail(store, run_id, exc)
        raise
    if not resuming:
        store.record_sites(run_id, {s.name: site_summary(s) for s in sites})
        store.add_event(run_id, f"run started: {config.algorithm} on {len(sites)} sites")
    return Federation(config, sites, coordinator, store, run_id, run_dir, model.config())


def _nodes(
    config: SimulationConfig,
    sites: list[SiteData],
    backend: Any,
    model_config: dict[str, Any],
    loss: str,
    run_dir: Path,
) -> list[Node]:
    """One in-process node per site, its local state under ``run_dir/nodes/<site>``.

    Nodes run one after another, so unless a site trains its own part of the model (partial
    training) or keeps a personal one, they share one warm model. Beyond
    ``STATE_IN_MEMORY_UP_TO`` sites the local state (e.g. CODASCA's c_k, one model's size per
    site) stays on disk between rounds: memory then does not grow with the number of sites.
    """
    privacy = None
    if config.dp_clip is not None:
        privacy = Privacy(config.dp_clip, config.dp_noise, config.seed)
    personalization = config.personalization()
    shared = None
    if personalization is None and not config.partial_training:
        num_labels = sites[0].num_labels
        model = model_from_config(model_config)
        shared = Trainable(model, build_loss(loss, num_labels, [0.5] * num_labels))
    return [
        Node(
            site,
            backend,
            model_config,
            loss,
            state_dir=run_dir / "nodes" / site.name,
            batch_size=config.batch_size,
            min_pos_fraction=config.min_pos_fraction,
            min_neg_fraction=config.min_neg_fraction,
            seed=config.seed * 1000 + i,
            privacy=privacy,
            memory_budget=budget,
            personalization=personalization,
            trainable=shared,
            state_in_memory=len(sites) <= STATE_IN_MEMORY_UP_TO,
            augment=config.augmentation(),
            tta=config.test_time_augmentation(),
        )
        for i, (site, budget) in enumerate(zip(sites, config.memory_budgets(), strict=True))
    ]


def warm_start(
    config: SimulationConfig,
    sites: list[SiteData],
    model: DenseNetClassifier,
    store: RunStore,
    run_id: str,
    run_dir: Path,
) -> dict[str, torch.Tensor]:
    """``warmup_rounds`` rounds of fedavg + cross-entropy on the same sites, from the main
    run's initial network; the weights it ends with (``w/``, ``buf/``) start the main run.
    Recorded in the store as its own fedavg run, named in the main run's events."""
    options = {**config.to_dict(), "algorithm": "fedavg", "loss": "ce", "backend_options": {}}
    backend = build_backend("fedavg", **SimulationConfig(**options).backend_hyperparameters())
    warm_model = model_from_config(model.config())
    warm_model.load_state_dict(model.state_dict())
    num_labels = model.num_labels
    server = Trainable(warm_model, build_loss("ce", num_labels, [0.5] * num_labels))
    warm_id = store.create_run("fedavg", {**options, "warmup_for": run_id}, git_revision())
    nodes = _nodes(config, sites, backend, model.config(), "ce", run_dir / "warmup")
    coordinator = Coordinator(
        backend,
        LocalTransport(nodes),
        store,
        warm_id,
        run_dir / "warmup",
        server,
        participation=config.participation,
        seed=config.seed,
    )
    try:
        coordinator.run(config.warmup_rounds)
    finally:
        coordinator.close()
    store.finish_run(warm_id, "completed", {"warmup_for": run_id})
    store.add_event(run_id, f"warm start: {config.warmup_rounds} fedavg+CE rounds, run {warm_id}")
    tensors = backend.global_tensors(coordinator.state)
    return {k: v for k, v in tensors.items() if k.startswith((WEIGHT, BUFFER))}


def run_simulation(
    config: SimulationConfig, on_round: Callable[[RoundRecord], None] | None = None
) -> dict[str, Any]:
    """Run the federation, record it in ``config.runs_dir`` and return the JSON summary."""
    return _complete(build_federation(config), on_round)


def resume_simulation(
    runs_dir: str | Path, run_id: str, on_round: Callable[[RoundRecord], None] | None = None
) -> dict[str, Any]:
    """Continue an interrupted run from its last recorded round, with its recorded config.

    Rounds already in the store are neither lost nor repeated; with the same seed the result
    equals the uninterrupted run's.
    """
    with RunStore(runs_dir) as store:
        try:
            run = store.run(run_id)
        except KeyError:
            raise ValueError(f"no run {run_id!r} in {store.path}") from None
    if run["status"] == "completed":
        raise ValueError(f"run {run_id!r} already completed: nothing to resume")
    return _complete(build_federation(recorded_config(run["config"], runs_dir), run_id), on_round)


def recorded_config(recorded: dict[str, Any], runs_dir: str | Path) -> SimulationConfig:
    """The config a run was recorded with; options added to fed-auc since then take the value
    that reproduces how it trained (a run recorded before the negative floor had none)."""
    return SimulationConfig(**{"min_neg_fraction": 0.0, **recorded, "runs_dir": str(runs_dir)})


def rounds_left(runs_dir: str | Path, run_id: str) -> int:
    """Rounds a resume of ``run_id`` still has to train (for a progress bar)."""
    with RunStore(runs_dir) as store:
        done = store.rounds(run_id)["round"].max()
        total = store.run(run_id)["config"]["rounds"]
    return int(total) - (0 if done != done else int(done))  # NaN: no round yet


def _complete(fed: Federation, on_round: Callable[[RoundRecord], None] | None) -> dict[str, Any]:
    """Train the rounds still missing, export the selected model and close the run."""
    config, coordinator, store = fed.config, fed.coordinator, fed.store
    best = track_best_model(coordinator, fed.run_dir, config.select)
    try:
        coordinator.run(config.rounds, on_round)
        best.settle(store, fed.run_id, coordinator)
        thresholds = operating_thresholds(coordinator.transport, coordinator.sites, best.tensors)
    except BaseException as exc:
        _fail(store, fed.run_id, exc)
        raise
    finally:
        coordinator.close()
    cards = [data_card(site) for site in fed.sites]
    return close_run(store, fed.run_id, fed.run_dir, config, coordinator.backend, best,
                     fed.model_config, cards, thresholds)  # fmt: skip


def close_run(
    store: RunStore,
    run_id: str,
    run_dir: Path,
    config: SimulationConfig,
    backend: Any,
    best: BestModel,
    model_config: dict[str, Any],
    cards: list[dict[str, Any]],
    thresholds: list[float],
) -> dict[str, Any]:
    """Export the selected model with its card, record the run as completed, close the store.

    Shared by ``fed-auc simulate`` and the Flower coordinator, so both export the same thing.
    """
    summary = summarize(run_id, run_dir, config, store)
    summary["selected_round"] = best.round
    selected = store.rounds(run_id).set_index("round", drop=False).loc[best.round].copy()
    site_frame = store.site_rounds(run_id).query(f"round == {best.round}").copy()
    what = f"the model of round {best.round}"
    if best.metrics is not None:  # an average: its own scores replace the round's
        what = f"the mean of the models of rounds {best.rounds}"
        summary["averaged_rounds"] = best.rounds
        for key in ("global_auc", "global_val_auc", "worst_site_auc"):
            selected[key] = best.metrics[key]
        for key in ("auc", "auc_lo", "auc_hi", "n_test"):
            values = {site: m[key] for site, m in best.metrics["sites"].items()}
            site_frame[key] = site_frame["site"].map(values)
    card = model_card(
        summary, selected, site_frame, config, backend.hyperparameters(), model_config, cards
    )
    card["threshold"] = thresholds
    card["averaged_rounds"] = best.rounds if best.averaged else None
    summary["exported_auc"] = card["global_auc"]
    model_path = export_model(run_dir / "model", best.tensors, model_config, card)
    summary["model_path"] = str(model_path)
    store.add_event(run_id, f"exported {what}")
    store.add_event(run_id, "run completed")
    store.finish_run(run_id, "completed", summary)
    store.close()
    return summary


def operating_thresholds(transport, sites: list[str], tensors) -> list[float]:
    """Per label, the score threshold maximising Youden's J on the pooled validation scores
    (0.5 where validation has one class): the model card's operating point."""
    answers = transport.evaluate(sites, tensors, pooled=True)
    parts = [a.splits["val"] for a in answers.values() if hasattr(a, "splits")]
    parts = [p for p in parts if p.scores is not None and p.n > 0]
    if not parts:
        return []
    labels = np.concatenate([p.labels for p in parts])
    scores = np.concatenate([p.scores for p in parts])
    return [youden_threshold(labels[:, j], scores[:, j]) for j in range(labels.shape[1])]


def _fail(store: RunStore, run_id: str, exc: BaseException) -> None:
    """Mark the run failed (rounds already recorded stay) and close the store."""
    store.add_event(run_id, f"run failed: {type(exc).__name__}: {exc}", level="error")
    store.finish_run(run_id, "failed", {"error": str(exc)})
    store.close()


def site_summary(site: SiteData) -> dict[str, Any]:
    """The data-card summary of a site kept in the store: the card, with each split's
    counts and intensity also at the top level (``train``, ``val``, ``test``)."""
    card = data_card(site)
    summary: dict[str, Any] = {**site.meta, **card}
    for name, stats in card["splits"].items():
        intensity = stats["intensity"] or {}
        summary[name] = {
            **stats,
            "intensity_mean": intensity.get("mean"),
            "intensity_std": intensity.get("std"),
        }
    return summary


def summarize(
    run_id: str, run_dir: Path, config: SimulationConfig, store: RunStore
) -> dict[str, Any]:
    """The run's JSON summary, read back from the store (so a resumed run reports all rounds)."""
    rounds = store.rounds(run_id)
    final = store.site_rounds(run_id).query(f"round == {config.rounds}")
    return {
        "run_id": run_id,
        "run_dir": str(run_dir),
        "algorithm": config.algorithm,
        "rounds": config.rounds,
        "global_auc": [_number(v) for v in rounds["global_auc"]],  # index = round; 0 = initial
        "worst_site_auc": [_number(v) for v in rounds["worst_site_auc"]],
        "site_auc": {row.site: _number(row.auc) for row in final.itertuples()},
        "site_personal_auc": {row.site: _number(row.personal_auc) for row in final.itertuples()},
        "trained_groups": {
            row.site: json.loads(row.trained_groups)
            if isinstance(row.trained_groups, str)
            else None
            for row in final.itertuples()
        },
    }


def _number(value: Any) -> float | None:
    return None if value is None or value != value else float(value)


def _integer(value: Any) -> int | None:
    return None if value is None or value != value else int(value)


def model_card(
    summary: dict[str, Any],
    selected: pd.Series,
    site_frame: pd.DataFrame,
    config: SimulationConfig,
    hyperparameters: dict[str, Any],
    model_config: dict[str, Any],
    cards: list[dict[str, Any]],
) -> dict[str, Any]:
    """The card of the exported model: the selected round's metrics (its ``rounds`` row and
    ``site_rounds`` rows in the store) and the data cards of the sites it was trained on."""
    site_rows = [
        {
            "site": r.site,
            "n": _integer(r.n),
            "positives": json.loads(r.positives) if isinstance(r.positives, str) else None,
            "n_test": _integer(r.n_test),
            "auc": _number(r.auc),
            "auc_lo": _number(r.auc_lo),
            "auc_hi": _number(r.auc_hi),
        }
        for r in site_frame.itertuples()
    ]
    synthetic = config.data == "synthetic"
    if synthetic:
        description = (
            f"Synthetic chest-X-ray-like federation of {config.sites} sites "
            f"({config.image_size} px, seed {config.seed}), generated by "
            "fed_auc.data.synthetic; no patient data."
        )
    else:
        description = (
            f"{config.data}, partition {cards[0]['details'].get('partition')} into {len(cards)} "
            f"sites (seed {config.seed}; manifest {PARTITION_FILE} in the run folder), "
            f"images resized to {config.image_size} px."
        )
    return {
        "run_id": summary["run_id"],
        "algorithm": config.algorithm,
        "loss": config.loss,
        "seed": config.seed,
        "rounds": config.rounds,
        "warmup_rounds": config.warmup_rounds,
        "selection": config.select,
        "selected_round": int(selected["round"]),
        "model_config": model_config,
        "image_size": config.image_size,
        "tta": config.test_time_augmentation(),
        "label_names": cards[0]["label_names"],
        "hyperparameters": hyperparameters,
        "global_auc": _number(selected["global_auc"]),
        "global_val_auc": _number(selected["global_val_auc"]),
        "initial_auc": summary["global_auc"][0],
        "worst_site_auc": _number(selected["worst_site_auc"]),
        "sites": site_rows,
        "data_description": description,
        "data_cards": cards,
        "intended_use": (
            "Demonstration and testing of federated AUC maximization. Not for clinical use."
        ),
        "limitations": [
            "Trained on synthetic images: says nothing about performance on real X-rays."
            if synthetic
            else "Sites are simulated by a partitioner; real hospitals differ in more ways.",
            "AUC confidence intervals are Hanley–McNeil approximations on small test splits.",
            "The exported round was chosen by validation AUC; its test AUC is still unbiased "
            "only if the test split played no part in any choice.",
        ],
    }
