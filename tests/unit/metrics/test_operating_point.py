"""Operating-point figures from binned score counts, against independent references:
sklearn on the raw scores, direct counting, and Newcombe's published Wilson intervals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binomtest
from sklearn.metrics import brier_score_loss, roc_auc_score, roc_curve

from fed_auc.metrics.operating_point import (
    ScoreBins,
    at_threshold,
    auc_from_bins,
    brier_score,
    default_edges,
    pool,
    reliability,
    score_bins,
    sensitivity_at_specificity,
    wilson_ci,
)

EDGES = default_edges(n_bins=100)


def sample(seed: int, n: int = 200, top: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = (rng.random(n) < 0.3).astype(float)
    scores = np.clip(0.3 + 0.25 * labels + rng.normal(0, 0.2, n), 0, top)
    return labels, scores


def floored(scores: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Each score moved down to its bin's left edge: the information the bins keep."""
    index = np.clip(np.searchsorted(edges, scores, side="right") - 1, 0, len(edges) - 2)
    return edges[index]


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    [
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_matches_newcombe_1998_table_1(k, n, lo, hi):
    got = wilson_ci(k, n)
    assert got == pytest.approx((lo, hi), abs=6e-5)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 500), st.data())
def test_wilson_equals_scipys_binomtest_interval(total, data):
    successes = data.draw(st.integers(0, total))
    reference = binomtest(successes, total).proportion_ci(0.95, method="wilson")
    assert wilson_ci(successes, total) == pytest.approx((reference.low, reference.high), abs=1e-12)


def test_wilson_is_none_without_a_denominator_and_refuses_impossible_counts():
    assert wilson_ci(0, 0) is None
    with pytest.raises(ValueError, match="3 successes out of 2"):
        wilson_ci(3, 2)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([0.2, 0.35, 0.5, 0.71]))
def test_counts_at_an_edge_equal_direct_counting(seed, threshold):
    labels, scores = sample(seed)
    edges = default_edges([threshold])
    op = at_threshold(score_bins(labels, scores, edges), threshold)
    called = scores >= threshold
    assert (op.tp, op.fn) == (np.sum(called & (labels == 1)), np.sum(~called & (labels == 1)))
    assert (op.tn, op.fp) == (np.sum(~called & (labels == 0)), np.sum(called & (labels == 0)))
    assert op.sensitivity.value == pytest.approx(np.mean(called[labels == 1]))
    assert op.specificity.value == pytest.approx(np.mean(~called[labels == 0]))
    assert op.ppv.value == pytest.approx(np.mean(labels[called] == 1))
    assert op.npv.value == pytest.approx(np.mean(labels[~called] == 0))
    assert op.sensitivity.lo <= op.sensitivity.value <= op.sensitivity.hi


def test_the_cards_threshold_becomes_an_edge_and_others_are_refused():
    edges = default_edges([0.363])
    assert np.any(edges == 0.363) and edges[0] == 0 and edges[-1] == 1
    bins = score_bins(*sample(1), edges)
    assert at_threshold(bins, 0.363).threshold == 0.363
    with pytest.raises(ValueError, match=r"0.3631 is not a bin edge.*\[0.363, 0.364"):
        at_threshold(bins, 0.3631)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([0.8, 0.9, 0.95]))
def test_sensitivity_at_specificity_matches_sklearn_on_the_binned_scores(seed, target):
    labels, scores = sample(seed, top=0.95)  # the top bin stays empty: specificity 1 reachable
    op = sensitivity_at_specificity(score_bins(labels, scores, EDGES), target)
    fpr, tpr, _ = roc_curve(labels, floored(scores, EDGES), drop_intermediate=False)
    reference = tpr[(1 - fpr) >= target - 1e-12].max()
    assert op.sensitivity.value == pytest.approx(reference)
    assert op.specificity.value >= target


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_auc_from_bins_is_sklearns_auc_of_the_binned_scores_and_close_to_the_raw(seed):
    labels, scores = sample(seed)
    auc = auc_from_bins(score_bins(labels, scores, EDGES))
    assert auc == pytest.approx(roc_auc_score(labels, floored(scores, EDGES)), abs=1e-12)
    assert auc == pytest.approx(roc_auc_score(labels, scores), abs=0.02)


def test_brier_and_reliability_are_exact_from_the_sums():
    labels, scores = sample(7)
    bins = score_bins(labels, scores, default_edges([0.363]))
    assert brier_score(bins) == pytest.approx(brier_score_loss(labels, scores), abs=1e-12)
    diagram = reliability(bins)
    assert sum(b.n for b in diagram) == len(labels)
    for b in diagram:
        inside = (scores >= b.lo) & ((scores < b.hi) | (b.hi == 1.0))
        assert b.n == inside.sum()
        if b.n:
            assert b.mean_score == pytest.approx(scores[inside].mean())
            assert b.observed.value == pytest.approx(labels[inside].mean())


def test_pooling_sites_equals_binning_their_images_together():
    parts = [sample(seed, n=50 + seed) for seed in range(4)]
    pooled = pool([score_bins(y, s, EDGES) for y, s in parts])
    together = score_bins(
        np.concatenate([y for y, _ in parts]), np.concatenate([s for _, s in parts]), EDGES
    )
    a, b = pooled.to_dict(), together.to_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert np.allclose(a[key], b[key], rtol=1e-12, atol=1e-12), key
    with pytest.raises(ValueError, match="other bin edges"):
        pool([score_bins(*parts[0], EDGES), score_bins(*parts[1], default_edges([0.3333]))])


def test_one_class_gives_no_auc_and_no_sensitivity_at_specificity():
    labels = np.zeros(20)
    bins = score_bins(labels, np.linspace(0, 1, 20), EDGES)
    assert auc_from_bins(bins) is None
    assert sensitivity_at_specificity(bins, 0.9) is None
    assert at_threshold(bins, 0.5).sensitivity.value is None


def test_unknown_labels_are_skipped_and_bad_input_is_named():
    labels = np.array([1.0, np.nan, 0.0])
    bins = score_bins(labels, np.array([0.9, 0.5, 0.1]), EDGES)
    assert (bins.n_positive, bins.n_negative) == (1, 1)
    with pytest.raises(ValueError, match="within \\[0, 1\\]"):
        score_bins(np.array([1.0]), np.array([1.5]), EDGES)
    with pytest.raises(ValueError, match="labels must be 0, 1 or NaN"):
        score_bins(np.array([2.0]), np.array([0.5]), EDGES)


def test_round_trip_through_json_and_checked_loading():
    bins = score_bins(*sample(3), default_edges([0.4235]))
    again = ScoreBins.from_dict(bins.to_dict())
    assert again.to_dict() == bins.to_dict()
    broken = bins.to_dict() | {"positives": [1, 2]}
    with pytest.raises(ValueError, match="site x label 0: positives has 2 values for 1001 bins"):
        ScoreBins.from_dict(broken, where="site x label 0")
    with pytest.raises(ValueError, match="site x: not score bins"):
        ScoreBins.from_dict({"edges": [0, 1]}, where="site x")
