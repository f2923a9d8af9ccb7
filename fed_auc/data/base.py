"""The in-memory shape every data source produces: one `SiteData` per hospital."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch

# The one rule for a site's (and a registered model's) name: it names folders, files, store
# rows and Flower node records on every system, so ASCII only.
NAME_RULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_name(name: object, what: str) -> str:
    """``name`` if it follows ``NAME_RULE``, else a ValueError naming ``what`` and the value."""
    if not isinstance(name, str) or not NAME_RULE.fullmatch(name):
        raise ValueError(
            f"{what} = {name!r}: letters, digits, '_', '.' and '-' (ASCII), starting with a "
            "letter or digit"
        )
    return name


@dataclass
class Split:
    """Images and labels of one split of one site.

    images: float32 (N, 1, H, W) in [0, 1].
    labels: float32 (N, L) with 1 = positive, 0 = negative, NaN = unknown (ignored by losses
    and metrics).
    """

    images: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or self.images.shape[1] != 1:
            raise ValueError(f"images must be (N, 1, H, W), got {tuple(self.images.shape)}")
        if self.labels.ndim != 2 or self.labels.shape[0] != self.images.shape[0]:
            raise ValueError(
                f"labels must be (N, L) with N = {self.images.shape[0]}, "
                f"got {tuple(self.labels.shape)}"
            )

    def __len__(self) -> int:
        return self.images.shape[0]

    @property
    def num_labels(self) -> int:
        return self.labels.shape[1]

    def positives(self) -> list[int]:
        """Number of known positives per label."""
        return [int((self.labels[:, j] == 1).sum()) for j in range(self.num_labels)]

    def known(self) -> list[int]:
        """Number of known (non-NaN) labels per label column."""
        return [int((~torch.isnan(self.labels[:, j])).sum()) for j in range(self.num_labels)]


@dataclass
class SiteData:
    """One hospital's data: train / val / test splits plus descriptive metadata."""

    name: str
    train: Split
    val: Split
    test: Split
    label_names: list[str]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


def common_label_count(label_names: dict[str, list[str]]) -> int:
    """The federation's number of labels: every site must have the same label columns."""
    first_site, first = next(iter(label_names.items()))
    for site, names in label_names.items():
        if list(names) != list(first):
            raise ValueError(
                f"sites disagree on their labels: {first_site} has {list(first)}, "
                f"{site} has {list(names)}"
            )
    return len(first)
