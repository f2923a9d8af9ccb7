"""Partial model training (EmbracingFL): which output-side layer groups a weak site trains.

A site declares a memory budget, in bytes or as a fraction of a full-model training step.
The budget maps to the longest output-side suffix of the model's layer groups whose
*measured* training step fits: the bytes autograd saves for backward (counted with
``torch.autograd.graph.saved_tensors_hooks``, the frozen prefix running under ``no_grad``)
plus weights, gradients and the backend's per-tensor state of the trained part. The paper's
capacity counts the same things (2·params + 2·activations), estimated instead of measured.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fed_auc.models import group_names, group_of, model_from_config
from fed_auc.trainable import BUFFER, WEIGHT, Tensors, Trainable

# Per-tensor state a backend keeps for the trained part, in copies of the weights:
# CODASCA holds the stage reference v_0, the global c and its own c_k.
STATE_COPIES = 3
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}
_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30})


@dataclass(frozen=True)
class MemoryBudget:
    """A site's training memory: absolute bytes, or a fraction of a full-model step."""

    bytes: int | None = None
    fraction: float | None = None

    def limit(self, full_step: int) -> int:
        return self.bytes if self.bytes is not None else int(self.fraction * full_step)


def parse_budget(value: float | int | str, where: str = "memory budget") -> MemoryBudget:
    """``0.15`` (fraction of a full step, in (0, 1]), ``2000000`` (bytes) or ``"64MiB"``."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", value)
        unit = match.group(2).upper() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(
                f"{where}: {value!r} is not a size; use e.g. 0.4, 500000000 or '64MiB'"
            )
        return parse_budget(float(match.group(1)) * _UNITS[unit], where)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{where}: must be a fraction in (0, 1] or bytes > 1, got {value!r}")
    if value <= 1:
        return MemoryBudget(fraction=float(value))
    return MemoryBudget(bytes=int(value))


@dataclass(frozen=True)
class StepMemory:
    """Measured memory of one training step that trains ``groups`` (input side frozen)."""

    groups: tuple[str, ...]
    activations: int  # bytes autograd saved for the backward pass
    weights: int  # trained parameters and buffers, and the loss's a, b, α
    gradients: int
    state: int  # the backend's per-tensor state (STATE_COPIES × weights)

    @property
    def total(self) -> int:
        return self.activations + self.weights + self.gradients + self.state


def _bytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def measure_step(
    model_config: dict, groups: Sequence[str], batch_size: int, image_size: int
) -> StepMemory:
    """Run one real training step (forward and gradients) that trains ``groups``, counting
    every distinct storage autograd saves, parameters excluded (they are counted once)."""
    torch.manual_seed(0)
    model = model_from_config(model_config)
    num_labels = int(model_config["num_labels"])
    trainable = Trainable.with_loss(model, "auc_margin")
    if list(groups) != group_names(model):
        trainable.train_only(groups)
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    channels = int(model_config.get("in_channels", 1))
    x = torch.randn(batch_size, channels, image_size, image_size)
    y = (torch.arange(batch_size * num_labels).reshape(batch_size, num_labels) % 2).float()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        trainable.gradients(x, y)
    variables = [*trainable.primal.values(), *trainable.dual.values()]
    weights = _bytes(variables) + _bytes(list(trainable.buffers.values()))
    return StepMemory(
        tuple(groups), sum(saved.values()), weights, _bytes(variables), STATE_COPIES * weights
    )


@functools.lru_cache(maxsize=16)
def _table(arch: str, num_labels: int, channels: int, batch: int, size: int) -> list[StepMemory]:
    config = {"arch": arch, "num_labels": num_labels, "in_channels": channels}
    order = group_names(model_from_config(config))
    return [measure_step(config, order[k:], batch, size) for k in range(len(order))]


def memory_table(model_config: dict, batch_size: int, image_size: int) -> list[StepMemory]:
    """Measured step memory for every split point, the full model first (cached)."""
    return _table(
        model_config["arch"],
        int(model_config["num_labels"]),
        int(model_config.get("in_channels", 1)),
        batch_size,
        image_size,
    )


def choose_groups(
    table: Sequence[StepMemory], budget: MemoryBudget, where: str = "site"
) -> list[str] | None:
    """The longest suffix whose step fits the budget; None when the whole model fits."""
    limit = budget.limit(table[0].total)
    for row in table:
        if row.total <= limit:
            return None if row is table[0] else list(row.groups)
    raise ValueError(
        f"{where}: memory budget of {limit:,} bytes is below the smallest trainable part "
        f"({table[-1].groups[0]}: {table[-1].total:,} bytes)"
    )


def model_groups(names: Sequence[str]) -> list[str] | None:
    """Layer groups, input to output, of a payload's ``w/`` and ``buf/`` tensor names;
    None when the names are not a DenseNet's (e.g. a toy model)."""
    groups: dict[str, None] = {}
    for name in names:
        if name.startswith((WEIGHT, BUFFER)):
            try:
                groups[group_of(name.split("/", 1)[1])] = None
            except ValueError:
                return None
    return list(groups) or None


def trained_part(model: Tensors, groups: Sequence[str]) -> Tensors:
    """The tensors of ``model`` a site that trained ``groups`` sends: their weights and
    buffers, plus a, b, α. ``groups`` must be a non-empty output-side suffix."""
    order = model_groups(list(model))
    groups = list(groups)
    if order is None or not groups or groups != order[len(order) - len(groups) :]:
        raise ValueError(f"trained groups {groups} are not an output-side suffix of {order}")
    keep = set(groups)
    return {
        n: t
        for n, t in model.items()
        if not n.startswith((WEIGHT, BUFFER)) or group_of(n.split("/", 1)[1]) in keep
    }
