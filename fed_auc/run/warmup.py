"""The cross-entropy warm-up before an AUC run, and what the AUC phase starts from (keep, reset or
recenter the classifier).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import torch

from fed_auc.algorithms import build_backend
from fed_auc.coordinator.loop import Coordinator
from fed_auc.coordinator.policy import RoundPolicy
from fed_auc.coordinator.selection import BestModel, Stage, track_best_model
from fed_auc.exchange import Transport
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.models import DenseNetClassifier, group_of, model_from_config
from fed_auc.run.start import secure_aggregation
from fed_auc.store.records import RoundRecord
from fed_auc.store.run_store import RunStore
from fed_auc.trainable import BUFFER, WEIGHT, Tensors, Trainable


def warm_start(
    config: ExperimentConfig,
    model: DenseNetClassifier,
    store: RunStore,
    run_id: str,
    run_dir: Path,
    transport_for: Callable[[str, Any], Transport],
    new_run: Callable[[dict[str, Any]], str],
    pooled_scoring: bool = True,
    personal: Collection[str] = (),
    record: dict[str, Any] | None = None,
    fixed_steps: dict[str, int] | None = None,
    on_round: Callable[[RoundRecord], None] | None = None,
    best: BestModel | None = None,
) -> Tensors:
    """``warmup_rounds`` rounds of fedavg + cross-entropy on the same sites, from the main
    run's initial network; the weights it ends with (``w/``, ``buf/``) start the main run.
    Recorded in the store as its own fedavg run, named in the main run's events.
    ``transport_for(warm_run_id, hyperparameters)`` reaches the same sites' nodes for that
    run (fedavg with these hyperparameters, cross-entropy); ``new_run(record)`` creates the
    warm-up's run in the store (``fed_auc.run.frame.new_run``). ``personal``: tensors the nodes
    keep (personal heads), as in the main run; ``fixed_steps``: the τ_i sites set in their own
    files, which the warm-up asks for as the main run does (a Flower node runs them anyway).
    ``on_round``: told each warm-up round as it is recorded (a progress bar counts them).
    ``best``: the main run's export candidates, offered every warm-up round's model."""
    options = {**config.to_dict(), "algorithm": "fedavg", "loss": "ce", "backend_options": {}}
    hyperparameters = ExperimentConfig(**options).backend_hyperparameters()
    backend = build_backend("fedavg", **hyperparameters)
    warm_model = model_from_config(model.config())
    warm_model.load_state_dict(model.state_dict())
    server = Trainable.with_loss(warm_model, "ce")
    recorded = {**options, **(record or {}), "warmup_for": run_id}  # record: data_record
    warm_id = new_run(recorded)
    transport = transport_for(warm_id, hyperparameters)
    coordinator = Coordinator(
        backend,
        transport,
        store,
        warm_id,
        run_dir / "warmup",
        server,
        RoundPolicy(
            participation=config.participation,
            seed=config.seed,
            pooled_scoring=pooled_scoring,
            local_work=config.local_work(list(transport.register()), fixed_steps),
            secure=secure_aggregation(config),  # the warm-up's replies are as private
        ),
        personal,
    )
    if best is not None:
        track_best_model(coordinator, best, Stage("warm-up", warm_id, "fedavg", "ce"))
    try:
        coordinator.run(config.warmup_rounds, on_round)
    finally:
        coordinator.close()
    store.finish_run(warm_id, "completed", {"warmup_for": run_id})
    store.add_event(run_id, f"warm start: {config.warmup_rounds} fedavg+CE rounds, run {warm_id}")
    tensors = backend.global_tensors(coordinator.state)
    warm = {k: v for k, v in tensors.items() if k.startswith((WEIGHT, BUFFER))}
    if config.warmup_head == "reset":
        return reset_classifier(warm, model)
    if config.warmup_head == "recenter":
        return recenter_classifier(warm, coordinator.pos_ratio)
    return warm


def reset_classifier(tensors: Tensors, model: DenseNetClassifier) -> Tensors:
    """``tensors`` with the classifier (output layer) set back to ``model``'s initial values.

    LibAUC's two-stage recipe drops the cross-entropy head before its AUC phase: a head fitted
    to CE saturates the sigmoid scores that the AUC-margin loss then has to move."""
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = dict(tensors)
    for name in tensors:
        key = name.split("/", 1)[1]
        if group_of(key) == "classifier":
            out[name] = initial[key]
    return out


def recenter_classifier(tensors: Tensors, pos_ratio: list[float]) -> Tensors:
    """``tensors`` with each label's output bias moved by −logit(p_l), p_l its prevalence.

    A classifier fitted with cross-entropy to p = 5 % positives scores most images near p,
    where the sigmoid's slope h(1 − h) ≈ 0.05 scales the AUC-margin loss's gradient down;
    the shift puts a calibrated model's mean score near ½ (slope ≈ ¼) and leaves every
    image's rank, hence every AUC, unchanged. Needs only the registered counts (p)."""
    shift = torch.logit(torch.tensor(pos_ratio, dtype=torch.float64))
    out = dict(tensors)
    biases = [n for n in tensors if n.startswith(WEIGHT) and n.endswith("bias")
              and group_of(n.split("/", 1)[1]) == "classifier"]  # fmt: skip
    if len(biases) != 1 or out[biases[0]].shape != shift.shape:
        raise ValueError(f"expected one classifier bias of shape {tuple(shift.shape)}, "
                         f"found {biases}")  # fmt: skip
    bias = out[biases[0]]
    out[biases[0]] = bias - shift.to(bias.dtype)
    return out
