"""Poisson sampling for DP-SGD: every row joins a batch on its own coin, with a known rate.

The accountant's amplification by subsampling (fed_auc.privacy.accounting) assumes Poisson sampling:
each row is in a batch independently, with probability at most q. ``BatchStream``'s
fixed-size batches from shuffled epochs are not that, so DP-SGD draws its batches here.

Class floors. The AUC losses need both classes in a batch, so ``BatchStream`` tops batches up
to a floor of positives (negatives). Here a floor raises that class's rate instead: the
expected batch still holds ``batch_size`` rows, but a positive row joins with probability
q₊ = floor·B / n₊ (≤ 1), higher than B/n when positives are rare, and negatives share the
rest. The accountant uses q = max(q₊, q₋): every row's rate is at most q, so the guarantee
holds for every patient, and the rarer class, sampled more often, is what sets it. The
rates depend on the class counts n₊ and n₋, which the site already reports in the clear at
registration; the guarantee is for the training examples given those counts.

Raising a class's rate over-samples it, so each row carries the weight r/q_c of its class
(r = B/n, the rate without floors): every row then counts r in expectation, as under uniform
sampling, and the AUC losses see the split's prevalence (fed_auc.losses, "Row weights").
The weights are constants, so a row's weighted gradient is still its own, clipped alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from fed_auc.data.augment import Augment
from fed_auc.data.base import Split
from fed_auc.data.memmap import chunks
from fed_auc.data.stream import Batch, SplitStream


class DrawLog(Protocol):
    """Where a stream tells DP-SGD what it drew (fed_auc.privacy.dp_sgd.DrawLog)."""

    def draw(self, q: float, normalizer: float) -> None: ...

    def chunk(self, pass_id: int, normalizer: float) -> None: ...


def class_rates(
    positives: int, negatives: int, batch_size: int, min_pos: float, min_neg: float
) -> tuple[float, float]:
    """(q₊, q₋): each class's inclusion probability for an expected ``batch_size`` rows with
    at least ceil(floor · batch_size) of each class expected (when the split has both)."""
    n = positives + negatives
    if positives == 0 or negatives == 0:
        rate = min(1.0, batch_size / n)
        return rate, rate
    expected_pos = batch_size * positives / n
    expected_neg = batch_size - expected_pos
    floor_pos = math.ceil(min_pos * batch_size)
    floor_neg = math.ceil(min_neg * batch_size)
    if expected_pos < floor_pos:
        expected_pos, expected_neg = floor_pos, batch_size - floor_pos
    elif expected_neg < floor_neg:
        expected_pos, expected_neg = batch_size - floor_neg, floor_neg
    return min(1.0, expected_pos / positives), min(1.0, expected_neg / negatives)


class PoissonBatches(SplitStream):
    """Infinite seeded, resumable stream of Poisson-sampled batches of a split (sizes vary,
    ``batch_size`` on average; a batch may be empty). Same interface as ``BatchStream``."""

    def __init__(
        self,
        split: Split,
        batch_size: int,
        seed: int = 0,
        min_pos_fraction: float = 0.05,
        augment: Augment | None = None,
        min_neg_fraction: float = 0.0,
    ) -> None:
        super().__init__(split, batch_size, seed, augment)
        n_pos = int(self._positive.sum())
        self.positive_rate, self.negative_rate = class_rates(
            n_pos, len(split) - n_pos, batch_size, min_pos_fraction, min_neg_fraction
        )
        self._rates = torch.where(
            self._positive,
            torch.tensor(self.positive_rate, dtype=torch.float64),
            torch.tensor(self.negative_rate, dtype=torch.float64),
        )
        self.sample_rate = float(self._rates.max())  # what the accountant assumes for all
        uniform = min(1.0, batch_size / len(split))
        self._weights = (uniform / self._rates).to(torch.get_default_dtype())
        self.log: DrawLog | None = None  # set by DP-SGD while a node trains
        self._passes = 0

    def next_indices(self) -> torch.Tensor:
        """Row indices of the next batch: every row's own coin against its class's rate."""
        coins = torch.rand(len(self.split), generator=self._generator, dtype=torch.float64)
        return torch.nonzero(coins < self._rates).flatten()

    def __next__(self) -> Batch:
        rows = self.next_indices()
        if self.log is not None:
            self.log.draw(self.sample_rate, float(self.batch_size))
        images = self._fetch(rows)
        if self.augment is not None and len(rows):
            images = self.augment(images)
        return Batch(images, self.split.labels[rows], self._weights[rows])

    def full_pass(self, batch_size: int = 256) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The whole split once, in order, in chunks (q = 1 for the accountant)."""
        self._passes += 1
        for start, images in zip(
            range(0, len(self.split), batch_size),
            chunks(self.split.images, batch_size, self.pin_memory, self.workers),
            strict=True,
        ):
            if self.log is not None:
                self.log.chunk(self._passes, float(len(images)))
            yield images, self.split.labels[start : start + batch_size]

    def state_dict(self) -> dict[str, Any]:
        return self._state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check_state(state)
        if "queue" in state:
            raise ValueError(
                "the saved sampler state is a fixed-size BatchStream's: this node's state was "
                "written without example-level DP; start the run afresh to add it"
            )
        self._load_generators(state)
