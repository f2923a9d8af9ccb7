"""A run's round-0 network: seeded random weights, or the ``--init`` file mapped onto it.

Built once before the run exists in the store (a refused file records nothing) and again
when it is opened; a registered model must be for the experiment's network, image size,
labels and positive class (a model for another class would score the run's positives low:
an inverted AUC), each mismatch an error naming both values. What was loaded is kept in the run
folder (``init.json``) for the model card.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fed_auc.data.labels import positive_class_text
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import save_json
from fed_auc.models import DenseNetClassifier, build_model
from fed_auc.registry.init_weights import REGISTERED, InitWeights, apply_init, read_init
from fed_auc.trainable import AUC, Trainable

INIT_FILE = "init.json"  # in the run folder: the card's record of the starting weights


@dataclass(frozen=True)
class StartingPoint:
    """The round-0 network, a registered model's AUC variables (``auc/`` names), and the
    report of what the file gave (None: random weights)."""

    model: DenseNetClassifier
    auc: dict[str, torch.Tensor] = field(default_factory=dict)
    report: dict[str, Any] | None = None


def starting_point(
    config: ExperimentConfig,
    num_labels: int,
    label_names: list[str] | None,
    positive_class: list[str] | None = None,
) -> StartingPoint:
    """The network the run starts from (seeded like every run); ``label_names`` and
    ``positive_class``: the sites', checked against a registered model's (None: not known
    yet)."""
    torch.manual_seed(config.seed)
    if config.init is None:
        return StartingPoint(build_model(config.model, num_labels, norm=config.model_norm()))
    init = read_init(config.init)
    if init.source == REGISTERED:
        _check_registered(init, config, num_labels, label_names)
        _check_positive_class(init, positive_class)
    elif init.arch != config.model:
        _mismatch(init, "architecture", init.arch, "model", config.model)
    model = build_model(
        config.model, num_labels, norm=config.model_norm(), input_norm=init.input_norm
    )
    report = apply_init(init, model)
    return StartingPoint(model, {AUC + k: v for k, v in init.auc.items()}, report)


def _check_registered(
    init: InitWeights, config: ExperimentConfig, num_labels: int, labels: list[str] | None
) -> None:
    model_config, card = init.model_config, init.card
    checks = [
        ("architecture", model_config["arch"], "model", config.model),
        ("norm", model_config.get("norm", "batch"), "norm", config.model_norm()),
        ("number of labels", int(model_config["num_labels"]), "labels", num_labels),
    ]
    if card.get("image_size") is not None:
        checks.append(("image size", int(card["image_size"]), "image_size", config.image_size))
    if labels is not None and card.get("label_names") is not None:
        checks.append(("labels", list(card["label_names"]), "sites' labels", list(labels)))
    for what, theirs, option, ours in checks:
        if theirs != ours:
            _mismatch(init, what, theirs, option, ours)


def _check_positive_class(init: InitWeights, sites: list[str] | None) -> None:
    """Refuse a model whose positive class is not the sites' (a model card without one, from
    before cards named it, is not checked)."""
    theirs = init.card.get("positive_class")
    if sites is None or theirs is None or list(theirs) == list(sites):
        return
    name = theirs[0] if len(theirs) == 1 else list(theirs)
    raise ValueError(
        f"--init {init.file.path}: the model was trained with positive class "
        f"{positive_class_text(list(theirs))!r}, the sites' is {positive_class_text(sites)!r}: "
        "its scores are for another class (for the other side of the same label, an inverted "
        "AUC). Start from a model trained "
        "for the sites' class, or, if both name the same class, give the sites the model's "
        f"name ([data] positive_class = {name!r} in each site file, or --positive-class)"
    )


def _mismatch(init: InitWeights, what: str, theirs: Any, option: str, ours: Any) -> None:
    raise ValueError(
        f"--init {init.file.path}: its {what} is {theirs!r}, the experiment's ({option}) "
        f"{ours!r}; start from a model for this experiment or change the experiment"
    )


def load_starting_point(
    server: Trainable, start: StartingPoint, run_dir: Path, started: bool
) -> list[str]:
    """Put a registered model's AUC variables into ``server`` where the loss has them (same
    names and shapes) and record the report in the run folder (a new run) or check that the
    file is the one the run started from (a resumed run). Returns events to record."""
    if start.report is None:
        return []
    current = {**server.primal, **server.dual}
    kept = {n: v for n, v in start.auc.items() if n in current and current[n].shape == v.shape}
    server.load(kept)
    report = {**start.report, "auc_variables": sorted(k[len(AUC) :] for k in kept)}
    file = run_dir / INIT_FILE
    if started and file.is_file():
        recorded = json.loads(file.read_text())["sha256"]
        if recorded != report["sha256"]:
            raise ValueError(
                f"--init {report['path']} changed since the run started (SHA-256 "
                f"{recorded[:12]}… then, {report['sha256'][:12]}… now); restore it to resume"
            )
        return []
    save_json(report, file)
    return [
        f"started from {report['format']} weights {report['path']} (SHA-256 "
        f"{report['sha256'][:12]}…): {len(report['loaded'])} tensors loaded, "
        f"{len(report['converted'])} converted, {len(report['replaced'])} replaced, "
        f"{len(report['initialized'])} initialized; input {report['input']}"
    ]
