"""Synthetic federation: determinism, shapes, label prevalence, visual signal, scanner shift,
profile validation and the shipped hospital TOMLs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from fed_auc.data.base import SiteData, Split
from fed_auc.data.synthetic import (
    DEFAULT_PROFILES,
    FINDINGS,
    SiteProfile,
    make_site,
    make_synthetic_federation,
)
from tests.support.paths import ROOT

HOSPITALS = ROOT / "hospitals"
REFERENCE = DEFAULT_PROFILES[0]


def splits(site: SiteData) -> list[Split]:
    return [site.train, site.val, site.test]


def profile(**changes: object) -> SiteProfile:
    """A reference-scanner site with enough images for stable averages."""
    base = dataclasses.replace(REFERENCE, n_train=300, n_val=0, n_test=0, prevalence=0.5)
    return dataclasses.replace(base, **changes)


def lung_box(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A box inside both lung fields of every patient, and the four image corners."""
    c = torch.linspace(-1.0, 1.0, size)
    y, x = torch.meshgrid(c, c, indexing="ij")
    lungs = (x.abs() > 0.2) & (x.abs() < 0.6) & (y > -0.55) & (y < 0.45)
    return lungs, (x.abs() > 0.9) & (y.abs() > 0.9)


def high_frequency(images: torch.Tensor) -> float:
    return float((images[..., 1:] - images[..., :-1]).abs().mean())


def test_same_seed_is_bit_identical_other_seed_differs() -> None:
    first = make_synthetic_federation(seed=7, scale=0.1)
    again = make_synthetic_federation(seed=7, scale=0.1)
    other = make_synthetic_federation(seed=8, scale=0.1)
    for a, b, c in zip(first, again, other, strict=True):
        for sa, sb, sc in zip(splits(a), splits(b), splits(c), strict=True):
            assert torch.equal(sa.images, sb.images) and torch.equal(sa.labels, sb.labels)
            assert not torch.equal(sa.images, sc.images)


def test_sites_draw_different_patients() -> None:
    same_scanner = [dataclasses.replace(REFERENCE, name=f"s{i}") for i in range(2)]
    a, b = make_synthetic_federation(num_sites=2, profiles=same_scanner, scale=0.1)
    assert not torch.equal(a.train.images, b.train.images)


def test_shapes_ranges_and_counts() -> None:
    sites = make_synthetic_federation(num_sites=6, image_size=32, num_labels=3, scale=0.1)
    assert [s.name for s in sites] == [p.name for p in DEFAULT_PROFILES]
    for site, p in zip(sites, DEFAULT_PROFILES, strict=True):
        assert site.label_names == list(FINDINGS[:3])
        for split, n in zip(splits(site), (p.n_train, p.n_val, p.n_test), strict=True):
            assert split.images.shape == (max(2, round(n * 0.1)), 1, 32, 32)
            assert split.images.dtype == torch.float32 and split.labels.shape[1] == 3
            assert split.images.min() >= 0.0 and split.images.max() <= 1.0
            assert set(split.labels.unique().tolist()) <= {0.0, 1.0}
        json.dumps(site.meta)  # data cards serialise it
        assert site.meta["profile"]["name"] == p.name


def test_single_label_default_is_generic_finding() -> None:
    (site,) = make_synthetic_federation(num_sites=1, scale=0.1)
    assert site.label_names == ["finding"] and site.train.labels.shape[1] == 1


@pytest.mark.parametrize("p", DEFAULT_PROFILES, ids=lambda p: p.name)
def test_prevalence_matches_profile(p: SiteProfile) -> None:
    site = make_site(p, label_names=FINDINGS, seed=3)
    for split in splits(site):
        n = len(split)
        for j, prevalence in enumerate(p.prevalences(len(FINDINGS))):
            expected = min(max(round(prevalence * n), 1), n - 1)
            assert split.positives()[j] == expected
            assert abs(expected / n - prevalence) <= max(1.5 / n, 0.01)


def test_tiny_splits_keep_both_classes() -> None:
    for site in make_synthetic_federation(num_sites=6, scale=0.01):
        for split in splits(site):
            assert 0 < split.positives()[0] < len(split)


def test_positives_are_brighter_in_the_lungs() -> None:
    split = make_site(profile(), seed=0).train
    positive = split.labels[:, 0] == 1
    difference = (split.images[positive].mean(0) - split.images[~positive].mean(0))[0]
    lungs, corners = lung_box(28)
    assert difference[lungs].mean() > 0.015
    assert difference[lungs].mean() > 3 * difference[corners].abs().mean()


@pytest.mark.parametrize("j", range(len(FINDINGS)), ids=FINDINGS)
def test_every_finding_changes_only_its_positives_inside_the_body(j: int) -> None:
    """Twin sites with and without findings image the same patients with the same noise."""
    with_findings = make_site(profile(), label_names=FINDINGS, seed=1).train
    without = make_site(profile(lesion_strength=0.0), label_names=FINDINGS, seed=1).train
    assert torch.equal(with_findings.labels, without.labels)
    change = (with_findings.images - without.images).abs()[:, 0]
    positive = with_findings.labels[:, j] == 1
    only_j = positive & (with_findings.labels.sum(1) == 1)
    none = with_findings.labels.sum(1) == 0
    assert torch.equal(change[none], torch.zeros_like(change[none]))
    assert change[only_j].amax(dim=(1, 2)).mean() > 0.05
    assert change[:, lung_box(28)[1]].max() == 0.0


def test_scanner_shift_changes_intensity_statistics() -> None:
    def images(**scanner: float) -> torch.Tensor:
        split = make_site(profile(**scanner), seed=4).train
        assert torch.equal(split.labels, reference.labels)  # same patients, other scanner
        return split.images

    reference = make_site(profile(), seed=4).train
    base = reference.images
    assert images(intensity_shift=0.1).mean() > base.mean() + 0.08
    assert images(intensity_shift=-0.1).mean() < base.mean() - 0.06
    assert images(contrast=1.5).std() > 1.3 * base.std()
    sharp = images(noise_std=0.0)
    assert high_frequency(images(noise_std=0.0, blur_sigma=1.5)) < 0.7 * high_frequency(sharp)
    assert high_frequency(images(noise_std=0.1)) > 1.5 * high_frequency(base)


def test_test_split_does_not_depend_on_train_size() -> None:
    small = make_site(dataclasses.replace(REFERENCE, n_train=50), seed=5)
    large = make_site(REFERENCE, seed=5)
    assert torch.equal(small.test.images, large.test.images)


def test_resolution_scales_blur_and_noise() -> None:
    site = make_site(dataclasses.replace(REFERENCE, n_train=20, n_test=2), image_size=64)
    assert site.train.images.shape == (20, 1, 64, 64)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_sites": 0}, "num_sites"),
        ({"num_sites": 1025}, "num_sites"),
        ({"num_sites": 3, "profiles": DEFAULT_PROFILES[:2]}, "num_sites"),
        ({"num_labels": 6}, "num_labels"),
        ({"scale": 0.0}, "scale"),
        ({"image_size": 4}, "image_size"),
    ],
)
def test_federation_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_synthetic_federation(**kwargs)


def test_make_site_rejects_unknown_label_and_short_prevalence() -> None:
    with pytest.raises(ValueError, match="pneumothorax"):
        make_site(REFERENCE, label_names=["pneumothorax"])
    short = dataclasses.replace(REFERENCE, prevalence=(0.1, 0.2))
    with pytest.raises(ValueError, match="prevalence"):
        make_site(short, label_names=FINDINGS[:3])


GOOD = {"name": "x", "n_train": 10, "n_val": 2, "n_test": 2, "prevalence": 0.2}


@pytest.mark.parametrize(
    ("changes", "field", "value"),
    [
        ({"prevalence": 1.5}, "prevalence", "1.5"),
        ({"prevalence": 0.0}, "prevalence", "0.0"),
        ({"prevalence": [0.2, 1.0]}, "prevalence", "1.0"),
        ({"prevalence": []}, "prevalence", "()"),
        ({"n_train": -5}, "n_train", "-5"),
        ({"n_test": -1}, "n_test", "-1"),
        ({"n_val": 2.5}, "n_val", "2.5"),
        ({"n_train": True}, "n_train", "True"),
        ({"contrast": 0.0}, "contrast", "0.0"),
        ({"noise_std": -0.1}, "noise_std", "-0.1"),
        ({"blur_sigma": float("nan")}, "blur_sigma", "nan"),
        ({"intensity_shift": "bright"}, "intensity_shift", "bright"),
        ({"name": "a b"}, "name", "a b"),
        ({"noise": 0.1}, "noise", "noise"),
    ],
)
def test_profile_errors_name_source_field_and_value(changes: dict, field: str, value: str) -> None:
    with pytest.raises(ValueError) as error:
        SiteProfile.from_dict({**GOOD, **changes}, source="site.toml")
    assert "site.toml" in str(error.value)
    assert field in str(error.value) and value in str(error.value)


def test_profile_requires_counts_and_prevalence() -> None:
    with pytest.raises(ValueError, match="missing required field.*prevalence"):
        SiteProfile.from_dict({k: v for k, v in GOOD.items() if k != "prevalence"})


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "site.toml"
    path.write_text(text)
    return path


def test_toml_errors_name_the_file(tmp_path: Path) -> None:
    table = "[synthetic]\nn_train = 10\nn_val = 2\nn_test = 2\n"
    cases = {
        'name = "x"\n' + table + "prevalence = 1.2\n": "prevalence",
        'name = "x"\n' + table + "prevalence = 0.2\ncontrast = \n": "invalid TOML",
        'name = "x"\n': r"\[synthetic\]",
        table + "prevalence = 0.2\n": "name",
        'name = "x"\n' + table + "prevalence = 0.2\nnoise_sd = 0.1\n": "noise_sd",
    }
    for text, message in cases.items():
        with pytest.raises(ValueError, match=message) as error:
            SiteProfile.from_toml(write(tmp_path, text))
        assert "site.toml" in str(error.value)
    with pytest.raises(ValueError, match="cannot read"):
        SiteProfile.from_toml(tmp_path / "missing.toml")


def test_toml_leaves_node_settings_alone(tmp_path: Path) -> None:
    text = (
        'name = "x"\nstate_dir = "state"\n[node]\nport = 1\n'
        "[synthetic]\nn_train = 10\nn_val = 2\nn_test = 2\nprevalence = [0.2, 0.3]\n"
    )
    loaded = SiteProfile.from_toml(write(tmp_path, text))
    assert loaded == SiteProfile.from_dict({**GOOD, "prevalence": [0.2, 0.3]})


def test_every_hospital_toml_equals_its_default_profile() -> None:
    paths = sorted(HOSPITALS.glob("*.toml"))
    defaults = {p.name: p for p in DEFAULT_PROFILES}
    assert sorted(path.stem for path in paths) == sorted(defaults)
    for path in paths:
        loaded = SiteProfile.from_toml(path)
        assert loaded.name == path.stem
        assert loaded == defaults[path.stem]


def test_beyond_the_default_profiles_come_seeded_scanner_variants() -> None:
    n = len(DEFAULT_PROFILES)
    sites = make_synthetic_federation(num_sites=n + 8, scale=0.02, seed=4)
    names = [s.name for s in sites]
    assert names[:n] == [p.name for p in DEFAULT_PROFILES] and len(set(names)) == n + 8
    variant = sites[n].meta["profile"]
    origin = dataclasses.asdict(DEFAULT_PROFILES[0])
    assert variant["name"] == f"{origin['name']}_1"
    assert variant["n_train"] == sites[0].meta["profile"]["n_train"]
    assert tuple(variant["prevalence"]) == tuple(origin["prevalence"])
    assert variant["contrast"] != origin["contrast"]  # its own scanner
    again = make_synthetic_federation(num_sites=n + 8, scale=0.02, seed=4)
    for a, b in zip(sites, again, strict=True):
        assert torch.equal(a.train.images, b.train.images)
    other = make_synthetic_federation(num_sites=n + 1, scale=0.02, seed=5)[n].meta["profile"]
    assert other["contrast"] != variant["contrast"]  # the seed draws the scanners
