"""A whole federation on one machine: synthetic sites, in-process nodes, one coordinator.

``SimulationConfig`` is everything ``fed-auc simulate`` accepts, validated up front;
``run_simulation`` builds the parts, runs the rounds, records them and exports the model.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fed_auc.algorithms import ALGORITHMS, build_backend, hyperparameter_names
from fed_auc.coordinator import Coordinator
from fed_auc.data.base import SiteData
from fed_auc.data.cards import data_card
from fed_auc.data.csv_images import UNCERTAIN_POLICIES
from fed_auc.data.partition import parse_partition
from fed_auc.data.spec import load_sites, parse_data_spec
from fed_auc.data.synthetic import DEFAULT_PROFILES
from fed_auc.evaluate import youden_threshold
from fed_auc.export import export_model
from fed_auc.io import save_json
from fed_auc.local_work import LocalWork
from fed_auc.losses import LOSSES, build_loss
from fed_auc.models import ARCHITECTURES, DenseNetClassifier, build_model, model_from_config
from fed_auc.node import Node
from fed_auc.store import RoundRecord, RunStore
from fed_auc.trainable import BUFFER, WEIGHT, Trainable
from fed_auc.transport.local import LocalTransport

PARTITION_FILE = "partition.json"


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
    # validation AUC ("best_val") rather than the last one ("last").
    warmup_rounds: int = 0
    select: str = "best_val"
    runs_dir: str = "runs"

    def __post_init__(self) -> None:
        if self.loss is None:
            self.loss = "ce" if self.algorithm == "fedavg" else "auc_margin"
        self.validate()

    def validate(self) -> None:
        """Fail early with the option name, the bad value and what was expected."""
        _choice("algorithm", self.algorithm, sorted(ALGORITHMS))
        _choice("loss", self.loss, LOSSES)
        _choice("model", self.model, sorted(ARCHITECTURES))
        if ALGORITHMS[self.algorithm].needs_minimax_loss and self.loss == "ce":
            raise ValueError(
                f"algorithm {self.algorithm!r} is a min-max AUC method: use --loss auc_margin "
                "or auc_square (cross-entropy works with fedavg only)"
            )
        synthetic = parse_data_spec(self.data).kind == "synthetic"
        _at_least("sites", self.sites, 1, len(DEFAULT_PROFILES) if synthetic else None)
        if self.partition is not None:
            parse_partition(self.partition)
        _choice("uncertain", self.uncertain, list(UNCERTAIN_POLICIES))
        _choice("select", self.select, ["best_val", "last"])
        _at_least("warmup_rounds", self.warmup_rounds, 0)
        if not (math.isfinite(self.feature_shift) and self.feature_shift >= 0):
            raise ValueError(f"feature_shift must be >= 0, got {self.feature_shift!r}")
        _at_least("rounds", self.rounds, 1)
        _at_least("local_steps", self.local_steps, 1)
        _at_least("batch_size", self.batch_size, 2)
        _at_least("image_size", self.image_size, 16, 512)
        _at_least("num_labels", self.num_labels, 1, 5)
        if not 0 < self.participation <= 1:
            raise ValueError(f"participation must be in (0, 1], got {self.participation!r}")
        if not 0 <= self.min_pos_fraction < 1:
            raise ValueError(f"min_pos_fraction must be in [0, 1), got {self.min_pos_fraction!r}")
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


def build_federation(config: SimulationConfig) -> Federation:
    """The sites (``config.data`` split by ``config.partition``), one in-process node each,
    a coordinator (after the optional warm-up), and a new run in the store."""
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
    run_id = store.create_run(config.algorithm, config.to_dict(), git_revision())
    run_dir = Path(config.runs_dir) / run_id
    if manifest is not None:
        save_json(manifest, run_dir / PARTITION_FILE)
    try:
        if config.warmup_rounds:
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
        )
    except BaseException as exc:
        _fail(store, run_id, exc)
        raise
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
    """One in-process node per site, its local state under ``run_dir/nodes/<site>``."""
    return [
        Node(
            site,
            backend,
            model_config,
            loss,
            state_dir=run_dir / "nodes" / site.name,
            batch_size=config.batch_size,
            min_pos_fraction=config.min_pos_fraction,
            seed=config.seed * 1000 + i,
        )
        for i, site in enumerate(sites)
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
    fed = build_federation(config)
    coordinator, store = fed.coordinator, fed.store
    backend = coordinator.backend
    best: dict[str, Any] = {}

    def track(record: RoundRecord) -> None:
        """Keep the global model of the round with the best validation AUC (or the last)."""
        score = _val_score(record)
        if (
            config.select == "last"
            or not best
            or (score is not None and (best["score"] is None or score > best["score"]))
        ):
            tensors = backend.global_tensors(coordinator.state)
            snapshot = {k: v.clone() for k, v in tensors.items()}
            best.update(score=score, record=record, tensors=snapshot)
        if on_round is not None:
            on_round(record)

    try:
        results = coordinator.run(config.rounds, track)
        thresholds = operating_thresholds(coordinator.transport, coordinator.sites, best["tensors"])
    except BaseException as exc:
        _fail(store, fed.run_id, exc)
        raise
    finally:
        coordinator.close()
    summary = summarize(fed.run_id, fed.run_dir, config, results)
    summary["selected_round"] = best["record"].round
    card = model_card(
        summary,
        best["record"],
        config,
        backend.hyperparameters(),
        fed.model_config,
        fed.sites,
    )
    card["threshold"] = thresholds
    model_path = export_model(fed.run_dir / "model", best["tensors"], fed.model_config, card)
    summary["model_path"] = str(model_path)
    store.add_event(fed.run_id, f"exported the model of round {best['record'].round}")
    store.add_event(fed.run_id, "run completed")
    store.finish_run(fed.run_id, "completed", summary)
    store.close()
    return summary


def _val_score(record: RoundRecord) -> float | None:
    """Pooled validation AUC, else the mean over sites of their validation AUC."""
    if record.global_val_auc is not None:
        return record.global_val_auc
    values = [s.val_auc for s in record.sites if s.val_auc is not None]
    return sum(values) / len(values) if values else None


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
    run_id: str, run_dir: Path, config: SimulationConfig, results: list[RoundRecord]
) -> dict[str, Any]:
    final = results[-1]
    return {
        "run_id": run_id,
        "run_dir": str(run_dir),
        "algorithm": config.algorithm,
        "rounds": config.rounds,
        "global_auc": [r.global_auc for r in results],  # index = round; 0 = before training
        "worst_site_auc": [r.worst_site_auc for r in results],
        "site_auc": {s.site: s.auc for s in final.sites},
    }


def model_card(
    summary: dict[str, Any],
    selected: RoundRecord,
    config: SimulationConfig,
    hyperparameters: dict[str, Any],
    model_config: dict[str, Any],
    sites: list[SiteData],
) -> dict[str, Any]:
    """The card of the exported model: the selected round's per-site metrics and the data
    cards of the sites it was trained on."""
    site_rows = [
        {
            "site": r.site,
            "n": r.n,
            "positives": r.positives,
            "n_test": r.n_test,
            "auc": r.auc,
            "auc_lo": r.auc_lo,
            "auc_hi": r.auc_hi,
        }
        for r in selected.sites
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
            f"{config.data}, partition {sites[0].meta.get('partition')} into {len(sites)} "
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
        "selected_round": selected.round,
        "model_config": model_config,
        "image_size": config.image_size,
        "label_names": sites[0].label_names,
        "hyperparameters": hyperparameters,
        "global_auc": selected.global_auc,
        "global_val_auc": selected.global_val_auc,
        "initial_auc": summary["global_auc"][0],
        "worst_site_auc": selected.worst_site_auc,
        "sites": site_rows,
        "data_description": description,
        "data_cards": [data_card(site) for site in sites],
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
