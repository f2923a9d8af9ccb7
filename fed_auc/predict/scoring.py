"""Score items in batches exactly as ``fed-auc evaluate`` scores: the card's image size, the
file reader every site uses, the card's test-time augmentation (``fed_auc.tta.predict``), the
chosen device and precision. An image that cannot be read is a result with its reason, never
the end of the job.

Images are decoded by a ``DataLoader`` (``workers`` processes, 0: in this process). Each
worker runs torch with one thread: decoding is per-file Python and C work, and a worker that
asked for as many threads as the network would fight it for the same cores (see
``fed_auc.threads``); the network's own thread count is the process's (``--threads``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from fed_auc.data.images import DEFAULT_ASPECT, BadImageError
from fed_auc.models import DenseNetClassifier
from fed_auc.node.compute import Compute
from fed_auc.predict.items import PredictItem, identifiers
from fed_auc.tta import check_tta, predict, scoring_batch


@dataclass
class Loaded:
    """One item read (``image``) or not (``error``), with its DICOM identifiers and, when
    asked for (an SR needs the study's attributes), its header."""

    index: int
    image: torch.Tensor | None
    error: str | None
    ids: dict[str, str]
    header: Any = None


@dataclass
class Scored:
    """One item's result: its (L,) scores, or why it has none."""

    index: int
    source: str
    scores: np.ndarray | None
    error: str | None
    ids: dict[str, str]
    header: Any = None


class _Items(Dataset):
    def __init__(self, items: Sequence[PredictItem], size: int | None, aspect: str,
                 keep_headers: bool) -> None:  # fmt: skip
        self.items, self.size, self.aspect, self.keep = items, size, aspect, keep_headers

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Loaded:
        return load(self.items[index], index, self.size, self.aspect, self.keep)


def load(item: PredictItem, index: int, size: int | None, aspect: str, keep_header: bool) -> Loaded:
    """Read one item; any failure becomes its ``error`` (the reader's message, which names
    the file), so one corrupt file costs one row."""
    header = None
    try:
        header = item.header()
        image = item.image(size, aspect)
    except BadImageError as exc:
        return Loaded(index, None, str(exc), identifiers(header), header if keep_header else None)
    except Exception as exc:  # noqa: BLE001 - a loader (DICOMweb, a decoder) may raise anything
        reason = f"cannot read image {item.source}: {type(exc).__name__}: {exc}"
        return Loaded(index, None, reason, identifiers(header), header if keep_header else None)
    return Loaded(index, image, None, identifiers(header), header if keep_header else None)


def _as_list(batch: list[Loaded]) -> list[Loaded]:
    return batch


def _one_thread(_: int) -> None:
    torch.set_num_threads(1)


def score_items(
    model: DenseNetClassifier,
    card: dict[str, Any],
    items: Sequence[PredictItem],
    compute: Compute | None = None,
    aspect: str = DEFAULT_ASPECT,
    batch: int | None = None,
    workers: int = 0,
    keep_headers: bool = False,
    on_batch: Callable[[list[Scored]], None] | None = None,
) -> Iterator[Scored]:
    """Each item's result, in order. ``batch``: images per forward pass (None: as many as
    ``fed_auc.tta.scoring_batch`` allows at the card's size; scores do not depend on it);
    ``on_batch``: called with each batch's results (a progress bar)."""
    size = card.get("image_size") or 28  # as fed-auc evaluate: the card's size
    tta = check_tta(card.get("tta", "none"))
    compute = compute or Compute(torch.device("cpu"))
    batch = batch or scoring_batch(torch.empty(0, 1, size, size))
    loader = DataLoader(
        _Items(items, size, aspect, keep_headers), batch_size=batch, shuffle=False,
        num_workers=workers, collate_fn=_as_list,
        worker_init_fn=_one_thread if workers else None,
    )  # fmt: skip
    model.to(compute.device).eval()
    for loaded in loader:
        good = [r for r in loaded if r.image is not None]
        scores: dict[int, np.ndarray] = {}
        if good:
            with compute.autocast():
                out = predict(model, torch.stack([r.image for r in good]), tta, batch=len(good))
            scores = {r.index: out[i] for i, r in enumerate(good)}
        results = [
            Scored(r.index, items[r.index].source, scores.get(r.index), r.error, r.ids, r.header)
            for r in loaded
        ]
        if on_batch is not None:
            on_batch(results)
        yield from results
