"""What identifies a site's data: one digest of its labels and images, for every split.

A release's key (``fed_auc.privacy.accounting.release_key``) and a node's lifetime privacy
budget are tied to the data they spend it on, not to a run id or a site name: the same images
in a new run, or under another name, are the same dataset.

Images held in memory are hashed by their bytes. Images read from the node's image cache
(``fed_auc.data.memmap.CachedImages``) are named by the cache file, whose name carries the
cache key (itself a digest of the source's content and every reading setting), and by the
rows the split takes: hashing a 100k-image cache at every start would read it all again.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from fed_auc.data.base import SiteData, Split
from fed_auc.data.memmap import CachedImages

SPLITS = ("train", "val", "test")


def site_data_digest(data: SiteData) -> str:
    """SHA-256 (hex) over the label names and, per split, the labels and the images."""
    digest = hashlib.sha256(repr(list(data.label_names)).encode())
    for name in SPLITS:
        split: Split = getattr(data, name)
        digest.update(f"\0{name}\0".encode())
        labels = split.labels.detach().cpu().contiguous()
        digest.update(f"{tuple(labels.shape)}".encode())
        digest.update(labels.numpy().tobytes())
        _hash_images(digest, split.images)
    return digest.hexdigest()


def _hash_images(digest, images) -> None:
    if isinstance(images, CachedImages):
        rows = np.arange(images.total) if images.rows is None else images.rows
        digest.update(f"cache\0{images.path.name}\0{images.offset}\0{images.size}\0".encode())
        digest.update(np.ascontiguousarray(rows, dtype=np.int64).tobytes())
        return
    tensor = images.detach().cpu().contiguous() if isinstance(images, torch.Tensor) else images
    digest.update(f"tensor\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
    digest.update(tensor.numpy().tobytes())
