"""What every sampler of a split shares: the checks, the seeded generator, the positive rows,
the training-time augmentation, and a saved state that only loads into a stream over a split
of the same size (``BatchStream`` for fixed-size batches, ``PoissonBatches`` for DP-SGD)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from fed_auc.data.augment import Augment
from fed_auc.data.base import Split


class Batch(NamedTuple):
    """One training batch: images, labels and one weight per row. A sampler that
    over-samples a class (the positive floor) gives its rows the weights that make the batch
    an unbiased sample of the split again (fed_auc.losses, "Row weights"); all ones when it
    samples rows uniformly."""

    images: torch.Tensor
    labels: torch.Tensor
    weights: torch.Tensor


class SplitStream:
    """An infinite, seeded, resumable stream of batches of one split; subclasses draw them."""

    def __init__(self, split: Split, batch_size: int, seed: int, augment: Augment | None) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size = {batch_size!r}: must be an integer >= 1")
        if len(split) == 0:
            raise ValueError("cannot sample batches from an empty split")
        self.split = split
        self.batch_size = batch_size
        self._positive = (split.labels == 1).any(dim=1)  # a row with any label 1
        self._generator = torch.Generator().manual_seed(int(seed))
        self.augment = augment

    def __iter__(self) -> SplitStream:
        return self

    def _state(self, **position: Any) -> dict[str, Any]:
        """The generator, the subclass's ``position`` in the stream, the split's size and the
        augmentation's own generator."""
        state = {"generator": self._generator.get_state(), **position, "num_rows": len(self.split)}
        if self.augment is not None:
            state["augment"] = self.augment.state_dict()
        return state

    def _check_state(self, state: dict[str, Any]) -> None:
        if state["num_rows"] != len(self.split):
            raise ValueError(
                f"state is for a split of {state['num_rows']} rows, this one has {len(self.split)}"
            )

    def _load_generators(self, state: dict[str, Any]) -> None:
        self._generator.set_state(state["generator"])
        if self.augment is not None and "augment" in state:
            self.augment.load_state_dict(state["augment"])
