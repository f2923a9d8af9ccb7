"""What a node needs from the experiment (``NodeSetup``) and from its operator (``SiteHosting``).

``NodeSetup`` is plain JSON: the Flower coordinator sends it with every request, and
``fed-auc simulate`` builds the same one for its in-process nodes. ``build_node`` turns it and
a site's data into a ``Node``, the same way for both, so a site trains identically in-process
and over Flower.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from fed_auc.algorithms.personal import Personalization
from fed_auc.data.base import SiteData, check_name
from fed_auc.node.compute import Compute
from fed_auc.node.policy.rules import NodePolicy

SEED_STRIDE = 1000  # a site's sampler seed: experiment seed · SEED_STRIDE + its index


@dataclass(frozen=True)
class NodeSetup:
    """The experiment as one node sees it (every field JSON-able)."""

    run_id: str
    algorithm: str
    hyperparameters: dict[str, Any]
    model_config: dict[str, Any]
    loss: str
    batch_size: int
    min_pos_fraction: float
    min_neg_fraction: float
    augment: str
    tta: str
    seed: int
    image_size: int
    num_labels: int
    data_scale: float = 1.0
    update_dp: dict[str, Any] | None = None  # fed_auc.privacy.update_dp.UpdateDP's fields
    example_dp: dict[str, Any] | None = None  # fed_auc.privacy.dp_sgd.ExampleDP's fields
    partial_training: bool = False  # the node trains what its own memory budget allows
    personalize: str | None = None
    personal_lambda: float = 1.0
    personal_lr_ratio: float = 1.0
    rounds: int | None = None  # what the site's operator approves (fed_auc.node.policy)

    def __post_init__(self) -> None:
        check_name(self.run_id, "run id")  # a single name: a node makes a folder of it

    def state_dir(self, root: str | Path) -> Path:
        """This run's state directory under a node's ``root``: always a folder of ``root``."""
        return Path(root) / check_name(self.run_id, "run id")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> NodeSetup:
        return cls(**values)

    def data_key(self) -> tuple:
        """What the site's images depend on: equal keys, same data (a node reuses them)."""
        return (self.image_size, self.num_labels, self.seed, self.data_scale)

    def for_run(self, run_id: str, algorithm: str, loss: str, hyperparameters: dict) -> NodeSetup:
        """The same nodes for another run on the same sites (the warm-up's fedavg + CE)."""
        return replace(
            self, run_id=run_id, algorithm=algorithm, loss=loss, hyperparameters=hyperparameters
        )

    def personalization(self) -> Personalization | None:
        if self.personalize is None:
            return None
        return Personalization(self.personalize, self.personal_lambda, self.personal_lr_ratio)


@dataclass(frozen=True)
class SiteHosting:
    """What a site's own operator decides for its node (its site file), never the
    coordinator: the same fields whether the node runs in-process or behind ``fed-auc node``."""

    name: str
    seed_index: int  # the site's share of the experiment seed (its batch sampler)
    order: tuple[int, int | str] = (0, "")  # where it stands among the registered sites
    synthetic: bool = False  # a synthetic profile, not image files
    memory_budget: float | int | str | None = None  # bytes or a fraction (partial training)
    augment: str | None = None  # its own augmentation over the experiment's
    tta: str | None = None
    local_steps: int | None = None  # its own τ_i
    compute: Compute | None = None  # its device and precision (None: fp32 on the CPU)
    policy: NodePolicy = NodePolicy()  # what it lets the federation ask (its [policy] table)


def check_batch_size(data: SiteData, batch_size: int) -> None:
    """A batch no larger than the site's training split, checked before anything is
    allocated: a larger one would draw (and hold) that many images per step."""
    n = len(data.train)
    if batch_size > n:
        where = data.meta.get("site_file")
        source = f" ({where})" if where else ""
        raise ValueError(
            f"site {data.name!r}{source}: batch size {batch_size} is larger than its "
            f"training split ({n} images); use a batch size of at most {n}"
        )
