"""Images read from a site's on-disk cache (``fed_auc.data.cache``) only when a batch needs them.

``CachedImages`` stands where a split's float tensor stood: it has the tensor's shape, and
indexing it (rows, slices) gives another view, so partitioning, subsets and the samplers'
row selection work on it unchanged and nothing is read. ``gather`` reads a view's rows
(uint8 → float32 in [0, 1]); ``loader`` reads given rows in torch ``DataLoader`` worker
processes (pinned memory when the batches go to a GPU): ``chunks`` streams a split in order
for scoring, and a sampler reads its next batches ahead (``fed_auc.data.stream``).

Each read opens the cache file, checks it is still the file that was verified when the cache
was opened (its inode, size, modification and change times), and reads the rows with
``os.preadv`` straight into the batch's array, one call per run of consecutive rows. A file
replaced, rewritten or truncated under a running node is refused by name with its remedy
(before, a truncated file failed as "mmap length is greater than file size"). Nothing stays
mapped, so a node's resident memory does not grow with the images it has read.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

LOADER_WORKERS = 2  # worker processes that read the next batches while the model computes
Identity = tuple[int, int, int, int]


def identity(found: os.stat_result) -> Identity:
    """What a rewrite, a replacement or a truncation of a file changes: inode, size,
    modification and change times (a change time cannot be set back by a user)."""
    return (found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


class CacheChangedError(ValueError):
    """The cache file is not the one verified when the node opened its cache."""


@dataclass(frozen=True, eq=False)  # views compare by identity, as tensors do
class CachedImages:
    """Rows ``rows`` (None: all, in order) of a uint8 (N, 1, S, S) array at byte ``offset``
    of the cache file ``path``, which had ``verified`` identity when its content was
    verified; reads give float32 in [0, 1]."""

    path: Path
    offset: int
    total: int
    size: int
    verified: Identity
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
        return CachedImages(
            self.path, self.offset, self.total, self.size, self.verified, base[index]
        )

    def read_uint8(self) -> np.ndarray:
        """The rows as a uint8 (n, 1, S, S) array in memory, read from the verified file."""
        rows = np.arange(self.total) if self.rows is None else self.rows
        out = np.empty((len(rows), 1, self.size, self.size), dtype=np.uint8)
        flat = out.reshape(len(rows), -1)
        starts = np.flatnonzero(np.diff(rows, prepend=-2) != 1)  # runs of consecutive rows
        try:
            descriptor = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise self._changed("is gone") from None
        try:
            if identity(os.fstat(descriptor)) != self.verified:
                raise self._changed("was replaced, rewritten or truncated")
            for start, end in zip(starts, [*starts[1:], len(rows)], strict=True):
                position = self.offset + int(rows[start]) * flat.shape[1]
                self._read_into(descriptor, memoryview(flat[start:end]).cast("B"), position)
        finally:
            os.close(descriptor)
        return out

    def _read_into(self, descriptor: int, buffer: memoryview, position: int) -> None:
        """Fill ``buffer`` from ``position`` (a read may return less than asked)."""
        while len(buffer):
            got = os.preadv(descriptor, [buffer], position)
            if got == 0:
                raise self._changed("ends before the rows it holds")
            buffer, position = buffer[got:], position + got

    def _changed(self, what: str) -> CacheChangedError:
        return CacheChangedError(
            f"image cache file {self.path} {what} since this node verified it: something "
            "other than this node changed its cache while it ran. Stop the node, delete "
            f"{self.path.parent} and start the node again to rebuild the cache from the "
            "source images"
        )

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
