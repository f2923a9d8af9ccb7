"""Partitioners: every row lands once, seeded, skewed as asked, patient-disjoint, reproducible."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fed_auc.data.partition import parse_partition, partition_pool, sites_from_manifest
from fed_auc.data.pool import ImagePool


def make_pool(n: int = 400, prevalence: float = 0.3, patients: bool = False, seed=0) -> ImagePool:
    gen = torch.Generator().manual_seed(seed)
    labels = (torch.rand(n, 1, generator=gen) < prevalence).float()
    return ImagePool(
        images=torch.rand(n, 1, 8, 8, generator=gen),
        labels=labels,
        label_names=["finding"],
        source="test",
        patient=np.array([f"p{i // 3}" for i in range(n)]) if patients else None,
    )


def _rows(manifest) -> list[int]:
    return [r for s in manifest["sites"].values() for k in ("train", "val", "test") for r in s[k]]


@pytest.mark.parametrize("partition", ["iid", "dirichlet:0.5", "quantity:1.0"])
def test_every_row_in_exactly_one_site_and_split(partition):
    pool = make_pool()
    sites, manifest = partition_pool(pool, partition, 4, seed=3)
    rows = _rows(manifest)
    assert sorted(rows) == list(range(len(pool)))
    assert sum(len(s.train) + len(s.val) + len(s.test) for s in sites) == len(pool)
    for site in sites:
        assert len(site.train) >= 4 and len(site.test) > 0


def test_iid_sizes_and_prevalence_are_even():
    sites, _ = partition_pool(make_pool(), "iid", 4, seed=0)
    sizes = [len(s.train) + len(s.val) + len(s.test) for s in sites]
    assert max(sizes) - min(sizes) <= 2
    prevalence = [s.train.positives()[0] / len(s.train) for s in sites]
    assert max(prevalence) - min(prevalence) < 0.1


def test_dirichlet_skews_labels_more_at_small_alpha():
    def spread(partition: str) -> float:
        values = []
        for seed in range(5):
            sites, _ = partition_pool(make_pool(seed=seed), partition, 4, seed=seed)
            prevalence = [s.train.positives()[0] / len(s.train) for s in sites]
            values.append(np.std(prevalence))
        return float(np.mean(values))

    assert spread("dirichlet:0.1") > 2 * spread("iid")


def test_quantity_skews_sizes():
    sites, _ = partition_pool(make_pool(), "quantity:0.3", 4, seed=1)
    sizes = sorted(len(s.train) for s in sites)
    assert sizes[-1] > 2 * sizes[0]


def test_same_seed_same_partition_other_seed_other_partition():
    pool = make_pool()
    _, first = partition_pool(pool, "dirichlet:0.5", 4, seed=7)
    _, again = partition_pool(pool, "dirichlet:0.5", 4, seed=7)
    _, other = partition_pool(pool, "dirichlet:0.5", 4, seed=8)
    assert first == again and first["sites"] != other["sites"]


def test_imratio_sets_each_sites_training_positive_ratio():
    sites, manifest = partition_pool(make_pool(600), "imratio:0.05,0.2,0.5", None, seed=0)
    for site, ratio in zip(sites, (0.05, 0.2, 0.5), strict=True):
        observed = site.train.positives()[0] / len(site.train)
        assert observed == pytest.approx(ratio, abs=1.5 / len(site.train))
        removed = manifest["sites"][site.name]["removed"]
        assert site.meta["removed_for_imratio"] == len(removed) > 0


def test_patients_never_span_sites_or_splits():
    pool = make_pool(300, patients=True)
    _, manifest = partition_pool(pool, "dirichlet:1.0", 3, seed=2)
    where: dict[str, tuple[str, str]] = {}
    for name, entry in manifest["sites"].items():
        for split in ("train", "val", "test"):
            for row in entry[split]:
                place = (name, split)
                assert where.setdefault(pool.patient[row], place) == place
    assert manifest["patient_disjoint"]
    assert sum(e["patients"] for e in manifest["sites"].values()) == 100


def test_given_splits_are_kept_per_site():
    pool = make_pool(300)
    pool.split = np.array(["train"] * 200 + ["val"] * 40 + ["test"] * 60)
    sites, manifest = partition_pool(pool, "iid", 3, seed=0)
    assert sum(len(s.val) for s in sites) == 40 and sum(len(s.test) for s in sites) == 60
    assert all(r >= 240 for e in manifest["sites"].values() for r in e["test"])


def test_natural_uses_the_site_column_and_checks_the_count():
    pool = make_pool(90)
    pool.site = np.array(["north", "south", "east"] * 30)
    sites, _ = partition_pool(pool, "natural", None, seed=0)
    assert [s.name for s in sites] == ["north", "south", "east"]
    with pytest.raises(ValueError, match="has 3 sites .* but 4 were asked for"):
        partition_pool(pool, "natural", 4)
    with pytest.raises(ValueError, match="needs a 'site' column"):
        partition_pool(make_pool(), "natural", None)


def test_manifest_rebuilds_the_same_sites_with_feature_shift():
    pool = make_pool()
    sites, manifest = partition_pool(pool, "iid", 3, seed=0, feature_shift=0.5)
    rebuilt = sites_from_manifest(pool, manifest)
    for a, b in zip(sites, rebuilt, strict=True):
        assert torch.equal(a.train.images, b.train.images)
    means = [float(s.train.images.mean()) for s in sites]
    assert max(means) - min(means) > 0.02  # iid rows, shifted scanners
    plain, _ = partition_pool(pool, "iid", 3, seed=0)
    assert not torch.equal(plain[0].train.images, sites[0].train.images)
    with pytest.raises(ValueError, match="does not fit"):
        sites_from_manifest(make_pool(50), manifest)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("random", "unknown kind 'random'"),
        ("dirichlet", "takes 1 number"),
        ("dirichlet:-1", "ALPHA must be > 0"),
        ("imratio:0.2,1.5", r"ratios in \(0, 1\)"),
        ("quantity:x", "not a comma-separated number list"),
    ],
)
def test_bad_partition_text_is_named(text, message):
    with pytest.raises(ValueError, match=message):
        parse_partition(text)


def test_impossible_partition_says_what_to_change():
    with pytest.raises(ValueError, match="could not give every one of 20 sites"):
        partition_pool(make_pool(60), "dirichlet:0.05", 20, seed=0)


def test_imratio_on_synthetic_sites_removes_training_positives_only():
    from fed_auc.data.spec import load_sites

    plain, _ = load_sites("synthetic", None, 8, seed=2, image_size=16, data_scale=0.2)
    sites, manifest = load_sites(
        "synthetic", "imratio:" + ",".join(["0.1"] * 8), 8, seed=2, image_size=16, data_scale=0.2
    )
    assert manifest is None and len(sites) == 8
    for before, after in zip(plain, sites, strict=True):
        positives = int((after.train.labels == 1).sum())
        assert positives == max(1, int(np.floor(0.1 * (len(after.train) - positives) / 0.9)))
        assert torch.equal(after.test.images, before.test.images)  # evaluation untouched
        assert after.meta["removed_train_rows"] == len(before.train) - len(after.train)
    with pytest.raises(ValueError, match="only imratio"):
        load_sites("synthetic", "dirichlet:0.5", 4, seed=0, image_size=16, data_scale=0.1)
    with pytest.raises(ValueError, match="2 ratio"):
        load_sites("synthetic", "imratio:0.1,0.2", 4, seed=0, image_size=16, data_scale=0.1)
