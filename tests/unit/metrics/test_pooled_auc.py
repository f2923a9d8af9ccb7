"""Pooled AUC from the sites' binned score counts: within its stated worst case of the exact one."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from fed_auc.metrics.operating_point import auc_from_bins, default_edges, pool, score_bins
from fed_auc.metrics.pooled import (
    binning_error_bound,
    bootstrap_bins_ci,
    pooled_from_bins,
    roc_from_bins,
)
from fed_auc.metrics.report import bootstrap_ci


def _near_tied_sites(seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Three sites whose scores crowd into a few 0.001-wide bins around 0.5, positives a hair
    higher on average: many (positive, negative) pairs share a bin, across sites."""
    rng = np.random.default_rng(seed)
    sites = []
    for n, prevalence in ((300, 0.2), (500, 0.5), (200, 0.8)):
        y = (rng.random(n) < prevalence).astype(float)
        s = 0.5 + rng.normal(0.0002 * y, 0.0008)
        sites.append((y, np.clip(s, 0, 1)))
    return sites


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pooled_binned_auc_is_within_the_stated_error_of_the_exact_pooled_auc(seed):
    sites = _near_tied_sites(seed)
    edges = default_edges([0.5])
    parts = {f"s{i}": score_bins(y, s, edges) for i, (y, s) in enumerate(sites)}
    pooled, result = pooled_from_bins(parts, n_boot=0)
    exact = roc_auc_score(
        np.concatenate([y for y, _ in sites]), np.concatenate([s for _, s in sites])
    )
    bound = result["auc_error_bound"]
    assert bound > 0.1  # a case hard for binning: most pairs share a bin
    assert abs(result["auc"] - exact) <= bound
    assert abs(result["auc"] - exact) > 1e-3  # and binning does change the number here
    assert result["sites"] == ["s0", "s1", "s2"]
    assert pooled.n_positive + pooled.n_negative == sum(len(y) for y, _ in sites)


def test_the_error_bound_is_attained_when_every_same_bin_pair_is_ordered_alike():
    y = np.array([0, 0, 0, 1, 1], dtype=float)
    s = np.array([0.7001, 0.7002, 0.7003, 0.7006, 0.7008])  # one bin: [0.700, 0.701)
    bins = score_bins(y, s, default_edges())
    assert roc_auc_score(y, s) == 1.0
    assert auc_from_bins(bins) == 0.5
    assert binning_error_bound(bins) == pytest.approx(0.5)  # |1.0 − 0.5|: the worst case


def test_without_shared_bins_the_binned_auc_is_exact_and_the_bound_zero():
    rng = np.random.default_rng(3)
    y = (rng.random(400) < 0.3).astype(float)
    s = (np.arange(400) + 0.5) / 400  # one image per 0.0025: never two in a 0.001 bin
    rng.shuffle(s)
    bins = score_bins(y, s, default_edges())
    assert binning_error_bound(bins) == 0.0
    assert auc_from_bins(bins) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_count_bootstrap_matches_the_image_bootstrap_and_is_seeded():
    rng = np.random.default_rng(4)
    y = (rng.random(600) < 0.4).astype(float)
    s = np.clip(rng.normal(0.45 + 0.15 * y, 0.12), 0, 1)
    s = np.round(s, 3) + 0.0005  # bin centres: binning loses nothing but exact ties
    bins = score_bins(y, s, default_edges())
    lo, hi = bootstrap_bins_ci(bins, 2000, seed=7)
    image_lo, image_hi = bootstrap_ci(y.astype(int), s, 2000, seed=7)
    assert lo < auc_from_bins(bins) < hi
    assert lo == pytest.approx(image_lo, abs=0.015) and hi == pytest.approx(image_hi, abs=0.015)
    assert bootstrap_bins_ci(bins, 2000, seed=7) == (lo, hi)
    assert bootstrap_bins_ci(bins, 2000, seed=8) != (lo, hi)


def test_one_class_counts_have_no_auc_no_bound_and_no_ci():
    bins = score_bins(np.zeros(20), np.linspace(0, 1, 20), default_edges())
    assert binning_error_bound(bins) is None
    assert bootstrap_bins_ci(bins, 100) == (None, None)
    assert roc_from_bins(bins) is None


def test_roc_from_bins_has_at_most_101_points_and_matches_the_pooled_counts():
    sites = _near_tied_sites(5)
    edges = default_edges([0.5])
    bins = pool([score_bins(y, np.clip(s * 1.6 - 0.3, 0, 1), edges) for y, s in sites])
    roc = roc_from_bins(bins)
    assert len(roc["fpr"]) <= 101
    assert roc["fpr"][0] == 0 and roc["tpr"][0] == 0 and roc["fpr"][-1] == roc["tpr"][-1] == 1
    assert np.all(np.diff(roc["fpr"]) >= 0) and np.all(np.diff(roc["tpr"]) >= 0)
    assert np.trapezoid(roc["tpr"], roc["fpr"]) == pytest.approx(auc_from_bins(bins), abs=0.01)


def test_the_node_bootstrap_scores_each_resample_as_sklearn_does():
    """The vectorized resample AUCs equal roc_auc_score on the same resamples (ties included)."""
    rng = np.random.default_rng(9)
    y = (rng.random(120) < 0.3).astype(int)
    s = np.round(rng.random(120) * 0.5 + 0.3 * y, 2)  # many exact ties
    lo, hi = bootstrap_ci(y, s, 150, seed=11)
    draws = np.random.default_rng(11).integers(0, 120, (150, 120))
    reference = [roc_auc_score(y[i], s[i]) for i in draws if 0 < y[i].sum() < 120]
    assert (lo, hi) == pytest.approx(
        (np.percentile(reference, 2.5), np.percentile(reference, 97.5)), abs=1e-12
    )
