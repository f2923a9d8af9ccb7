"""What every sampler of a split shares: the checks, the seeded generator, the positive rows,
the training-time augmentation, a saved state that only loads into a stream over a split
of the same size (``BatchStream`` for fixed-size batches, ``PoissonBatches`` for DP-SGD), and
the reading of a batch's images.

Reading ahead. A split cached on disk (``fed_auc.data.memmap``) can be read by DataLoader
workers a few batches ahead of training (``workers``, off by default). The rows still come from
the stream's own generator: a copy of the stream (its *shadow*, same position, no augmentation)
draws the upcoming rows for the loader, and each batch the stream itself draws is checked
against the rows read for it. So the same seed gives the same batches, a saved state is the
position of the batches used (not of those read ahead), and loading a state starts the
read-ahead again from there.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

from fed_auc.data.augment import Augment
from fed_auc.data.base import Split
from fed_auc.data.memmap import CachedImages, loader


class Batch(NamedTuple):
    """One training batch: images, labels and one weight per row. A sampler that
    over-samples a class (the positive floor) gives its rows the weights that make the batch
    an unbiased sample of the split again (fed_auc.losses, "Row weights"); all ones when it
    samples rows uniformly."""

    images: torch.Tensor
    labels: torch.Tensor
    weights: torch.Tensor


class SplitStream:
    """An infinite, seeded, resumable stream of batches of one split; subclasses draw them
    (``next_indices``). ``pin_memory``: read batches of a cached split into pinned memory
    (for a GPU); ``workers``: processes reading a cached split's batches ahead. The default,
    0, reads each batch when it is drawn, in this process: a read-ahead's worker processes
    live as long as the stream, and one that was left to the garbage collector (a node in a
    reference cycle) was seen to stall the process that collected it while its workers shut
    down; a node that wants the read-ahead (a GPU waiting on reads) sets ``workers``."""

    pin_memory = False
    workers = 0

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
        self._ahead: Iterator[tuple[torch.Tensor, torch.Tensor]] | None = None

    def next_indices(self) -> torch.Tensor:
        """Row indices of the next batch."""
        raise NotImplementedError

    def _fetch(self, rows: torch.Tensor) -> torch.Tensor:
        """The images of ``rows``, the batch just drawn: from the read-ahead when the split
        is cached (started here, after this batch, when none runs)."""
        images = self.split.images
        if not isinstance(images, CachedImages):
            return images[rows]
        if not self.workers:
            return images[rows].load()
        if self._ahead is None:  # read this batch here; the workers read from the next one
            upcoming = _Upcoming(self._shadow())
            self._ahead = iter(loader(images, upcoming, self.pin_memory, self.workers))
            return images[rows].load()
        read, batch = next(self._ahead)
        if not torch.equal(read, rows):  # drawn other than by next(): start again after it
            self._ahead = None
            return self._fetch(rows)
        return batch

    def _shadow(self) -> SplitStream:
        """A copy of this stream at its position, without augmentation or a draw log."""
        shadow = copy.copy(self)
        shadow.augment, shadow._ahead, shadow._generator = None, None, torch.Generator()
        if hasattr(shadow, "log"):
            shadow.log = None
        shadow.load_state_dict(self.state_dict())
        return shadow

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
        self._ahead = None  # what was read ahead belongs to the old position
        self._generator.set_state(state["generator"])
        if self.augment is not None and "augment" in state:
            self.augment.load_state_dict(state["augment"])


class _Upcoming:
    """The rows of the batches a shadow stream draws, one index array each, forever."""

    def __init__(self, shadow: SplitStream) -> None:
        self.shadow = shadow

    def __iter__(self) -> Iterator:
        while True:
            yield self.shadow.next_indices().numpy()
