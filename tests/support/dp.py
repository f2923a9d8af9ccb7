"""A tiny site for the DP tests."""

from __future__ import annotations

import torch

from fed_auc.data.base import SiteData, Split


def tiny_site(rows: int = 40) -> SiteData:
    generator = torch.Generator().manual_seed(2)
    images = torch.rand(rows, 1, 16, 16, generator=generator)
    labels = (torch.arange(rows) % 4 == 0).float().unsqueeze(1)
    images[labels[:, 0] == 1] += 0.3
    split = Split(images, labels)
    return SiteData("hospital_a", split, split, split, ["finding"])
