"""A loaded data source before it is split into sites: every image in one tensor.

Sources (MedMNIST npz, CSV + images) produce an `ImagePool`; a partitioner
(`fed_auc.data.partition`) turns it into one `SiteData` per site.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fed_auc.data.images import DEFAULT_ASPECT, image_report

SPLITS = ("train", "val", "test")


@dataclass
class ImagePool:
    """All images of a source, with optional per-row split, site and patient id.

    images: float32 (N, 1, H, W) in [0, 1]; labels: float32 (N, L), NaN = unknown.
    split / site / patient: arrays of N strings, or None when the source has no such column.
    files: N file names as warnings name them (image files only); flags: per-image booleans of
    `fed_auc.data.images.FLAGS` (what reading each file found), summarized per site in the
    data card.
    """

    images: torch.Tensor
    labels: torch.Tensor
    label_names: list[str]
    source: str
    split: np.ndarray | None = None
    site: np.ndarray | None = None
    patient: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    files: np.ndarray | None = None
    flags: dict[str, np.ndarray] | None = None

    def __post_init__(self) -> None:
        n = self.images.shape[0]
        if self.labels.shape != (n, len(self.label_names)):
            raise ValueError(
                f"{self.source}: labels must be ({n}, {len(self.label_names)}), "
                f"got {tuple(self.labels.shape)}"
            )
        for name in ("split", "site", "patient", "files"):
            column = getattr(self, name)
            if column is not None and len(column) != n:
                raise ValueError(f"{self.source}: {name} has {len(column)} rows, images {n}")
        if n == 0:
            raise ValueError(f"{self.source}: no images")

    def __len__(self) -> int:
        return self.images.shape[0]

    def subset(self, rows: np.ndarray) -> ImagePool:
        """The pool restricted to `rows` (same source and metadata)."""
        index = torch.as_tensor(rows, dtype=torch.long)
        pick = {
            k: None if v is None else v[rows]
            for k, v in (("split", self.split), ("site", self.site), ("patient", self.patient))
        }
        return ImagePool(
            self.images[index],
            self.labels[index],
            list(self.label_names),
            self.source,
            meta=dict(self.meta),
            files=None if self.files is None else self.files[rows],
            flags=None if self.flags is None else {k: v[rows] for k, v in self.flags.items()},
            **pick,
        )

    def image_report(self, rows: np.ndarray) -> dict[str, Any] | None:
        """The data card's account of how the images of `rows` were read (image files only)."""
        if self.flags is None or self.files is None:
            return None
        aspect = self.meta.get("aspect", DEFAULT_ASPECT)
        return image_report(self.flags, self.files, rows, aspect)
