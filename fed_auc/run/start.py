"""The coordinator of a run, built from the experiment config the same way for the main run and its
warm-up, in-process and over Flower.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from fed_auc.algorithms import build_backend
from fed_auc.coordinator.loop import Coordinator
from fed_auc.coordinator.policy import RoundPolicy
from fed_auc.coordinator.robust import Aggregation
from fed_auc.exchange import Transport
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.store.run_store import RunStore
from fed_auc.trainable import Trainable


def secure_aggregation(config: ExperimentConfig):
    """The run's ``SecureAggregation`` settings, or None when it is off."""
    if not config.secure_aggregation:
        return None
    from fed_auc.coordinator.secure_phase import SecureAggregation

    return SecureAggregation(
        config.secure_aggregation_threshold, config.secure_aggregation_neighbours
    )


def start_coordinator(
    config: ExperimentConfig,
    transport: Transport,
    store: RunStore,
    run_id: str,
    run_dir: Path,
    server: Trainable,
    personal: Collection[str],
    fixed_steps: dict[str, int],
    pooled_scoring: bool = True,
) -> Coordinator:
    """The coordinator of the main run, the same for both transports; ``fixed_steps``: the
    τ_i that sites set in their own files."""
    local_work = config.local_work(list(transport.register()), fixed_steps)
    policy = round_policy(config, local_work=local_work, pooled_scoring=pooled_scoring)
    backend = build_backend(config.algorithm, **config.backend_hyperparameters())
    return Coordinator(backend, transport, store, run_id, run_dir, server, policy, personal)


def round_policy(config: ExperimentConfig, **given: Any) -> RoundPolicy:
    """How the run's rounds go, from its options (``given``: what the run settled itself)."""
    return RoundPolicy(
        participation=config.participation,
        seed=config.seed,
        eval_every=config.eval_every,
        max_update_norm=config.max_update_norm,
        aggregation=Aggregation.parse(config.aggregation),
        secure=secure_aggregation(config),
        dp_relation=config.dp_relation(),
        compress=config.compress,
        **given,
    )
