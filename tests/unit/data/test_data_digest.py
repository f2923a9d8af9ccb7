"""The digest that names a site's data: any pixel or label changes it; its name does not."""

from __future__ import annotations

import torch

from fed_auc.data.base import SiteData, Split
from fed_auc.data.digest import site_data_digest


def _site(name: str = "north", seed: int = 0) -> SiteData:
    g = torch.Generator().manual_seed(seed)

    def split(n: int) -> Split:
        return Split(
            torch.rand(n, 1, 4, 4, generator=g), (torch.rand(n, 1, generator=g) > 0.5).float()
        )

    return SiteData(name, split(6), split(3), split(3), ["label"])


def test_the_same_data_under_another_name_has_the_same_digest():
    assert site_data_digest(_site("north")) == site_data_digest(_site("south"))


def test_one_pixel_or_one_label_of_any_split_changes_the_digest():
    base = site_data_digest(_site())
    for split in ("train", "val", "test"):
        changed = _site()
        getattr(changed, split).images[0, 0, 0, 0] += 0.5
        assert site_data_digest(changed) != base, split
        relabelled = _site()
        labels = getattr(relabelled, split).labels
        labels[0, 0] = 1.0 - labels[0, 0]
        assert site_data_digest(relabelled) != base, split
    assert site_data_digest(_site(seed=1)) != base
