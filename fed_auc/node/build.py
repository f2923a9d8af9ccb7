"""The one function that builds a node from its plain settings and a site's data, the same way in-
process and over Flower.
"""

from __future__ import annotations

from pathlib import Path

from fed_auc.algorithms import build_backend
from fed_auc.data.base import SiteData
from fed_auc.node.node import LocalTraining, Node
from fed_auc.node.setup import SEED_STRIDE, NodeSetup, SiteHosting, check_batch_size
from fed_auc.privacy.node_privacy import privacy_settings
from fed_auc.trainable import Trainable


def build_node(
    setup: NodeSetup,
    data: SiteData,
    hosting: SiteHosting,
    state_dir: str | Path,
    trainable: Trainable | None = None,
    state_in_memory: bool = True,
) -> Node:
    """The node of one site. The site's memory budget counts only under partial training;
    its augment/tta win over the experiment's; ``trainable``: a warm model shared by
    in-process nodes (never with partial training or personal models); its τ_i is what DP's
    planner plans for; its compute (device, precision) is its operator's, never the
    coordinator's: ``NodeSetup`` carries none."""
    check_batch_size(data, setup.batch_size)
    privacy = privacy_settings(setup.example_dp, setup.update_dp)
    augment = hosting.augment or setup.augment
    training = LocalTraining(
        setup.model_config,
        setup.loss,
        batch_size=setup.batch_size,
        min_pos_fraction=setup.min_pos_fraction,
        min_neg_fraction=setup.min_neg_fraction,
        seed=setup.seed * SEED_STRIDE + hosting.seed_index,
        augment=augment,
        tta=hosting.tta or (setup.tta if augment == setup.augment else None),
        local_steps=hosting.local_steps,
        memory_budget=hosting.memory_budget if setup.partial_training else None,
        personalization=setup.personalization(),
    )
    backend = build_backend(setup.algorithm, **setup.hyperparameters)
    return Node(
        data, backend, training, state_dir, privacy, hosting.compute, trainable, state_in_memory,
        run_setup=setup.to_dict(),
    )  # fmt: skip
