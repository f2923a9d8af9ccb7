"""The one function that builds a node from its plain settings and a site's data, the same way in-
process and over Flower.
"""

from __future__ import annotations

from pathlib import Path

from fed_auc.algorithms import build_backend
from fed_auc.data.base import SiteData
from fed_auc.node.compute import Compute
from fed_auc.node.node import Node
from fed_auc.node.setup import SEED_STRIDE, NodeSetup, check_batch_size
from fed_auc.privacy.dp_sgd import ExampleDP
from fed_auc.privacy.update_dp import UpdateDP
from fed_auc.trainable import Trainable


def build_node(
    setup: NodeSetup,
    data: SiteData,
    seed_index: int,
    state_dir: str | Path,
    memory_budget: float | int | str | None = None,
    augment: str | None = None,
    tta: str | None = None,
    trainable: Trainable | None = None,
    state_in_memory: bool = True,
    local_steps: int | None = None,
    compute: Compute | None = None,
) -> Node:
    """The node of one site. ``memory_budget`` counts only under partial training;
    ``augment``/``tta`` are the site's own choice over the experiment's; ``trainable``: a
    warm model shared by in-process nodes (never with partial training or personal models);
    ``local_steps``: the site's own τ_i (its file), which DP's planner plans for;
    ``compute``: the device and precision the site's operator chose (None: fp32 on the CPU),
    never the coordinator's: ``NodeSetup`` carries none."""
    check_batch_size(data, setup.batch_size)
    privacy = example = None
    if setup.example_dp is not None:
        example = ExampleDP(**setup.example_dp)
    elif setup.update_dp is not None:
        privacy = UpdateDP(**setup.update_dp)
    augment = augment or setup.augment
    return Node(
        data,
        build_backend(setup.algorithm, **setup.hyperparameters),
        setup.model_config,
        setup.loss,
        state_dir=state_dir,
        batch_size=setup.batch_size,
        min_pos_fraction=setup.min_pos_fraction,
        min_neg_fraction=setup.min_neg_fraction,
        seed=setup.seed * SEED_STRIDE + seed_index,
        privacy=privacy,
        example_dp=example,
        memory_budget=memory_budget if setup.partial_training else None,
        personalization=setup.personalization(),
        trainable=trainable,
        state_in_memory=state_in_memory,
        local_steps=local_steps,
        augment=augment,
        tta=tta or (setup.tta if augment == setup.augment else None),
        compute=compute,
    )
