"""Images read from a site's on-disk cache (``fed_auc.data.cache``) only when a batch needs them.

``CachedImages`` stands where a split's float tensor stood: it has the tensor's shape, and
indexing it (rows, slices) gives another view, so partitioning, subsets and the samplers'
row selection work on it unchanged and nothing is read. ``gather`` reads a view's rows
(uint8 → float32 in [0, 1]); ``loader`` reads given rows in torch ``DataLoader`` worker
processes (pinned memory when the batches go to a GPU): ``chunks`` streams a split in order
for scoring, and a sampler reads its next batches ahead (``fed_auc.data.stream``).

Each read maps the cache file for that read only: the pages it touched leave the process
when the mapping closes, so a node's resident memory does not grow with the images it has
read (a mapping kept open would keep every page read so far counted as resident).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

LOADER_WORKERS = 2  # worker processes that read the next batches while the model computes


@dataclass(frozen=True, eq=False)  # views compare by identity, as tensors do
class CachedImages:
    """Rows ``rows`` (None: all, in order) of a uint8 (N, 1, S, S) array at byte ``offset``
    of the cache file ``path``; reads give float32 in [0, 1]."""

    path: Path
    offset: int
    total: int
    size: int
    rows: np.ndarray | None = None

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self), 1, self.size, self.size))

    @property
    def ndim(self) -> int:
        return 4

    def __len__(self) -> int:
        return self.total if self.rows is None else len(self.rows)

    def numel(self) -> int:
        return len(self) * self.size * self.size

    def __getitem__(self, index: slice | torch.Tensor | np.ndarray | list[int]) -> CachedImages:
        """The view of some of these rows (nothing is read)."""
        if isinstance(index, torch.Tensor):
            index = index.numpy()
        if not isinstance(index, slice):
            index = np.asarray(index, dtype=np.int64).reshape(-1)
        base = np.arange(self.total) if self.rows is None else self.rows
        return CachedImages(self.path, self.offset, self.total, self.size, base[index])

    def read_uint8(self) -> np.ndarray:
        """The rows as a uint8 (n, 1, S, S) array in memory, through a mapping closed after."""
        mapped = np.memmap(
            self.path,
            dtype=np.uint8,
            mode="r",
            offset=self.offset,
            shape=(self.total, 1, self.size, self.size),
        )
        try:
            if self.rows is None:
                return np.array(mapped)
            if len(self.rows) and np.all(np.diff(self.rows) == 1):  # one contiguous block
                return np.array(mapped[self.rows[0] : self.rows[-1] + 1])
            return mapped[self.rows]
        finally:
            mapped._mmap.close()  # the pages read leave this process's resident memory

    def load(self) -> torch.Tensor:
        """The rows as float32 (n, 1, S, S) in [0, 1]."""
        return torch.from_numpy(self.read_uint8()).float().div_(255.0)


Images = torch.Tensor | CachedImages


def gather(images: Images) -> torch.Tensor:
    """A split's images (or rows of them) as a float tensor: read from the cache when cached."""
    return images.load() if isinstance(images, CachedImages) else images


class _Rows(Dataset):
    """A cached view whose item ``rows`` (an index array, read in a worker) is the pair
    (rows, their images): the rows come back with the images, so the reader can check they
    are the rows it asked for."""

    def __init__(self, images: CachedImages) -> None:
        self.images = images

    def __getitem__(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.as_tensor(rows), self.images[rows].load()


def loader(
    images: CachedImages, batches: Iterable[np.ndarray], pin_memory: bool, workers: int
) -> DataLoader:
    """A ``DataLoader`` reading each index array of ``batches``, in order, in ``workers``
    processes (two batches ahead each). They start from a ``forkserver`` with torch loaded:
    a node's gRPC threads are never forked, and no worker imports torch again."""
    if workers:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["torch", __name__])
    return DataLoader(
        _Rows(images),
        batch_size=None,  # each index array is one batch, already
        sampler=batches,
        num_workers=workers,
        pin_memory=pin_memory,
        multiprocessing_context=context if workers else None,
    )


def chunks(
    images: Images, batch: int, pin_memory: bool = False, workers: int = LOADER_WORKERS
) -> Iterator[torch.Tensor]:
    """The images in order, ``batch`` at a time; a cached split through ``loader``
    (``pin_memory`` when the chunks go to a GPU)."""
    if not isinstance(images, CachedImages):
        for start in range(0, len(images), batch):
            yield images[start : start + batch]
        return
    order = np.arange(len(images))
    parts = [order[start : start + batch] for start in range(0, len(images), batch)]
    for _, chunk in loader(images, parts, pin_memory, workers if len(parts) > 1 else 0):
        yield chunk
