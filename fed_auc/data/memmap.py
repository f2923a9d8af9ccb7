"""Images read from a site's on-disk cache (``fed_auc.data.cache``) only when a batch needs them.

``CachedImages`` stands where a split's float tensor stood: it has the tensor's shape, and
indexing it (rows, slices) gives another view, so partitioning, subsets and the samplers'
row selection work on it unchanged and nothing is read. ``gather`` reads a view's rows
(uint8 → float32 in [0, 1]); ``chunks`` streams a split in order through a torch
``DataLoader`` (worker processes, pinned memory when the batches go to a GPU) for scoring.

Each read maps the cache file for that read only: the pages it touched leave the process
when the mapping closes, so a node's resident memory does not grow with the images it has
read (a mapping kept open would keep every page read so far counted as resident).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

LOADER_WORKERS = 2  # worker processes that read a split's chunks while the model scores


@dataclass(frozen=True)
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
        if isinstance(index, slice) and self.rows is None and index.step in (None, 1):
            start, stop, _ = index.indices(self.total)
            base = np.arange(start, max(start, stop))
            return CachedImages(self.path, self.offset, self.total, self.size, base)
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


class _Chunks(Dataset):
    """Chunk ``i`` of a view: rows ``i·batch`` to ``(i+1)·batch``, read in a worker."""

    def __init__(self, images: CachedImages, batch: int) -> None:
        self.images, self.batch = images, batch

    def __len__(self) -> int:
        return -(-len(self.images) // self.batch)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.images[i * self.batch : (i + 1) * self.batch].load()


def chunks(
    images: Images, batch: int, pin_memory: bool = False, workers: int = LOADER_WORKERS
) -> Iterator[torch.Tensor]:
    """The images in order, ``batch`` at a time. A cached split streams through a
    ``DataLoader`` whose ``workers`` processes read the next chunks while this one is scored
    (``forkserver``: a node's gRPC threads are never forked); ``pin_memory`` for a GPU."""
    if not isinstance(images, CachedImages):
        for start in range(0, len(images), batch):
            yield images[start : start + batch]
        return
    workers = workers if len(images) > batch else 0  # one chunk: not worth a process
    loader = DataLoader(
        _Chunks(images, batch),
        batch_size=None,
        num_workers=workers,
        pin_memory=pin_memory,
        multiprocessing_context="forkserver" if workers else None,
    )
    yield from loader
