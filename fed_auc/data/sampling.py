"""Seeded, resumable mini-batch stream for local training on one site's split.

AUC losses need both classes in every batch (the pairwise terms vanish otherwise). Hospital
prevalence can be a few percent, so positives are over-sampled to a floor per batch; under
label skew a site can also be nearly all positive (a BreastMNIST site with 124 benign images
of 125), so negatives can have a floor too, as LibAUC's DualSampler fixes both counts.
Everything else is plain epoch-wise shuffling without replacement.

A floor changes which rows a batch holds, not the objective: a stream with a floor weights
each batch by class, so its positives weigh p·B in all and its negatives (1 − p)·B, with p
the split's positive fraction (a stratified sample; see ``BatchStream.row_weights``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from fed_auc.data.augment import Augment
from fed_auc.data.base import Split
from fed_auc.data.memmap import chunks
from fed_auc.data.stream import Batch, SplitStream


class BatchStream(SplitStream):
    """Infinite iterator of `(x, y)` batches of exactly `batch_size` rows of a split.

    Rows come from epoch-wise random permutations of the split, consumed in order, so with no
    floor every row is seen once per epoch. A row is positive when any of its labels is 1.
    When the split has both positive and negative rows, a batch that would carry fewer than
    ceil(min_pos_fraction * batch_size) positives (or ceil(min_neg_fraction * batch_size)
    negatives) takes fewer rows from the permutation and tops up with positives (negatives)
    from a separate, cycling permutation of that class; the rows it did not take stay first
    in line for the next batch. A split smaller than batch_size spans several reshuffled
    epochs in one batch, i.e. rows repeat (sampling with replacement).
    An ``augment`` transform (training-time augmentation) changes the images of the batches
    ``next()`` returns; ``full_pass`` and ``next_indices`` are never augmented.
    ``next()`` returns a ``Batch`` whose ``weights`` are ``row_weights`` of its rows.
    """

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
        for name, value in (("min_pos_fraction", min_pos_fraction),
                            ("min_neg_fraction", min_neg_fraction)):  # fmt: skip
            if not (isinstance(value, (int, float)) and 0 <= value < 1):
                raise ValueError(f"{name} = {value!r}: must be in [0, 1)")
        floors = math.ceil(min_pos_fraction * batch_size) + math.ceil(min_neg_fraction * batch_size)
        if floors > batch_size:
            raise ValueError(
                f"min_pos_fraction = {min_pos_fraction!r} and min_neg_fraction = "
                f"{min_neg_fraction!r} ask for {floors} floored rows in a batch of {batch_size}"
            )
        self._positive_rows = torch.nonzero(self._positive).flatten()
        self._negative_rows = torch.nonzero(~self._positive).flatten()
        self.positive_fraction = len(self._positive_rows) / len(split)
        has_both = 0 < len(self._positive_rows) < len(split)
        self.min_positives = math.ceil(min_pos_fraction * batch_size) if has_both else 0
        self.min_negatives = math.ceil(min_neg_fraction * batch_size) if has_both else 0
        self._queue = torch.empty(0, dtype=torch.long)  # rest of the current epoch(s)
        self._positive_queue = torch.empty(0, dtype=torch.long)
        self._negative_queue = torch.empty(0, dtype=torch.long)
        self.epoch = 0  # epochs started so far

    def __next__(self) -> Batch:
        rows = self.next_indices()
        images = self._fetch(rows)
        if self.augment is not None:
            images = self.augment(images)
        return Batch(images, self.split.labels[rows], self.row_weights(rows))

    def row_weights(self, rows: torch.Tensor) -> torch.Tensor:
        """One weight per row of a batch: ones without a floor; with one, the stratified
        weights p·B/k for each of the batch's k positive rows and (1 − p)·B/(B − k) for each
        negative (p = ``positive_fraction``), so a batch's weighted mean of any per-row
        quantity is unbiased for the split's mean whatever the floor added. A batch that
        lacks a class (possible only for a class without a floor) keeps ones.
        """
        weights = torch.ones(len(rows), dtype=torch.get_default_dtype())
        positive = self._positive[rows]
        k = int(positive.sum())
        if (self.min_positives or self.min_negatives) and 0 < k < len(rows):
            p, size = self.positive_fraction, len(rows)
            weights[positive] = p * size / k
            weights[~positive] = (1 - p) * size / (size - k)
        return weights

    def full_pass(self, batch_size: int = 256) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The whole split once, in order, in chunks: for full local gradients (FedSGDA).

        It does not move the stream: the next ``next()`` is what it would have been.
        """
        for start, images in zip(
            range(0, len(self.split), batch_size),
            chunks(self.split.images, batch_size, self.pin_memory, self.workers),
            strict=True,
        ):
            yield images, self.split.labels[start : start + batch_size]

    def next_indices(self) -> torch.Tensor:
        """Row indices of the next batch (what `next()` gathers)."""
        self._fill_queue()
        window = self._queue[: self.batch_size]
        take = self._rows_to_take(self._positive[window])
        rows = self._queue[:take]
        self._queue = self._queue[take:]
        positives = int(self._positive[rows].sum())
        extra_negatives = max(0, self.min_negatives - (take - positives))
        extra_positives = self.batch_size - take - extra_negatives
        if extra_positives:
            rows = torch.cat([rows, self._next_of_class(extra_positives, positive=True)])
        if extra_negatives:
            rows = torch.cat([rows, self._next_of_class(extra_negatives, positive=False)])
        return rows

    def _rows_to_take(self, window_positive: torch.Tensor) -> int:
        """Largest m with m + (each class's floor shortfall in the first m rows) == batch_size.

        That total grows by 0 or 1 per extra row (a row meets at most one class's shortfall),
        so the largest m meeting it is exact.
        """
        if self.min_positives == 0 and self.min_negatives == 0:
            return self.batch_size
        m = torch.arange(self.batch_size + 1)
        positives = torch.cat([torch.zeros(1, dtype=torch.long), window_positive.cumsum(0)])
        total = m + (self.min_positives - positives).clamp(min=0)
        total += (self.min_negatives - (m - positives)).clamp(min=0)
        return int(m[total == self.batch_size].max())

    def _fill_queue(self) -> None:
        while len(self._queue) < self.batch_size:
            epoch = torch.randperm(len(self.split), generator=self._generator)
            self._queue = torch.cat([self._queue, epoch])
            self.epoch += 1

    def _next_of_class(self, count: int, positive: bool) -> torch.Tensor:
        """The next ``count`` rows of one class's cycling permutation."""
        pool = self._positive_rows if positive else self._negative_rows
        queue = self._positive_queue if positive else self._negative_queue
        while len(queue) < count:
            queue = torch.cat([queue, pool[torch.randperm(len(pool), generator=self._generator)]])
        rows, queue = queue[:count], queue[count:]
        if positive:
            self._positive_queue = queue
        else:
            self._negative_queue = queue
        return rows

    def state_dict(self) -> dict[str, Any]:
        """Generator state and stream position: enough to continue the stream exactly."""
        return self._state(
            queue=self._queue.clone(),
            positive_queue=self._positive_queue.clone(),
            negative_queue=self._negative_queue.clone(),
            epoch=self.epoch,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict()` of a stream over the same split."""
        self._check_state(state)
        self._load_generators(state)
        self._queue = state["queue"].clone()
        self._positive_queue = state["positive_queue"].clone()
        # states saved before the negative floor existed have no negative queue
        self._negative_queue = state.get("negative_queue", self._negative_queue).clone()
        self.epoch = int(state["epoch"])
