"""DeLong's paired AUC difference against the 1988 paper's definitions, written out naively
here, and against a paired bootstrap: identical scores give exactly a zero-width interval at
zero; different scores the independent computation's variance and interval."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from fed_auc.metrics.paired import (
    FIXED_EFFECT,
    PairedDifference,
    fixed_effect,
    paired_auc_difference,
    paired_auc_differences,
)


def _psi(x: float, y: float) -> float:
    """The Heaviside kernel of DeLong et al. (1988): 1 if the positive scores higher, ½ for a
    tie, 0 otherwise."""
    return 1.0 if x > y else 0.5 if x == y else 0.0


def _delong_naive(labels, a, b, level=0.95):
    """O(m·n) from the paper: θ̂ = mean ψ, V10(X_i) = mean_j ψ(X_i, Y_j), V01(Y_j) = mean_i
    ψ(X_i, Y_j), S10 and S01 their 2 × 2 covariance matrices, var(θa − θb) =
    (S10_aa + S10_bb − 2 S10_ab)/m + (S01_aa + S01_bb − 2 S01_ab)/n."""
    pos, neg = labels == 1, labels == 0
    m, n = int(pos.sum()), int(neg.sum())
    v10 = np.zeros((2, m))
    v01 = np.zeros((2, n))
    theta = np.zeros(2)
    for r, s in enumerate((a, b)):
        x, y = s[pos], s[neg]
        psi = np.array([[_psi(xi, yj) for yj in y] for xi in x])
        theta[r] = psi.mean()
        v10[r], v01[r] = psi.mean(axis=1), psi.mean(axis=0)
    s10 = np.array([[np.sum((v10[r] - theta[r]) * (v10[t] - theta[t])) / (m - 1)
                     for t in range(2)] for r in range(2)])  # fmt: skip
    s01 = np.array([[np.sum((v01[r] - theta[r]) * (v01[t] - theta[t])) / (n - 1)
                     for t in range(2)] for r in range(2)])  # fmt: skip
    var = (s10[0, 0] + s10[1, 1] - 2 * s10[0, 1]) / m + (s01[0, 0] + s01[1, 1] - 2 * s01[0, 1]) / n
    se = math.sqrt(var)
    z = NormalDist().inv_cdf(0.5 + level / 2)
    diff = theta[0] - theta[1]
    return theta, diff, se, diff - z * se, diff + z * se


def _auc(labels, scores):
    """Mann–Whitney AUC by counting, ties ½ (fast enough for thousands of resamples)."""
    neg = np.sort(scores[labels == 0])
    pos = scores[labels == 1]
    below = np.searchsorted(neg, pos, "left")
    tied = np.searchsorted(neg, pos, "right") - below
    return (below.sum() + 0.5 * tied.sum()) / (len(pos) * len(neg))


def _tied_data(rng, size, prevalence=0.3):
    """Labels and two correlated scores rounded to few values, so that many pairs tie."""
    labels = (rng.random(size) < prevalence).astype(float)
    latent = labels * 0.8 + rng.normal(size=size)
    a = np.round(latent + 0.5 * rng.normal(size=size), 1)
    b = np.round(0.6 * latent + rng.normal(size=size), 1)
    return labels, a, b


def test_identical_scores_give_exactly_a_zero_width_interval_at_zero():
    rng = np.random.default_rng(1)
    labels, a, _ = _tied_data(rng, 300)
    result = paired_auc_difference(labels, a, a.copy())
    assert result.difference == 0.0 and result.se == 0.0
    assert result.lo == 0.0 and result.hi == 0.0
    assert result.p_value == 1.0
    assert result.auc_a == result.auc_b == pytest.approx(roc_auc_score(labels, a), abs=1e-12)
    assert (result.n, result.positives, result.method) == (300, int(labels.sum()), "DeLong")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_different_scores_match_the_papers_definitions_computed_naively(seed):
    rng = np.random.default_rng(seed)
    labels, a, b = _tied_data(rng, 120)
    assert len(np.unique(a)) < 60  # ties are exercised
    theta, diff, se, lo, hi = _delong_naive(labels, a, b)
    result = paired_auc_difference(labels, a, b)
    assert result.auc_a == pytest.approx(roc_auc_score(labels, a), abs=1e-12)
    assert result.auc_b == pytest.approx(roc_auc_score(labels, b), abs=1e-12)
    assert (result.auc_a, result.auc_b) == pytest.approx(tuple(theta), abs=1e-12)
    assert result.difference == pytest.approx(diff, abs=1e-12)
    assert result.se == pytest.approx(se, rel=1e-9)
    assert (result.lo, result.hi) == pytest.approx((lo, hi), abs=1e-12)
    assert result.p_value == pytest.approx(math.erfc(abs(diff) / se / math.sqrt(2)), rel=1e-9)
    assert result.se > 0 and result.lo < result.difference < result.hi


def test_the_interval_level_is_honoured():
    labels, a, b = _tied_data(np.random.default_rng(3), 200)
    wide, narrow = (paired_auc_difference(labels, a, b, level) for level in (0.99, 0.8))
    z99, z80 = (NormalDist().inv_cdf(0.5 + q / 2) for q in (0.99, 0.8))
    assert wide.hi - wide.lo == pytest.approx(2 * z99 * wide.se)
    assert narrow.hi - narrow.lo == pytest.approx(2 * z80 * narrow.se)


def test_delongs_standard_error_agrees_with_a_stratified_paired_bootstrap():
    rng = np.random.default_rng(4)
    labels, a, b = _tied_data(rng, 400, prevalence=0.35)
    result = paired_auc_difference(labels, a, b)
    assert _auc(labels, a) == pytest.approx(roc_auc_score(labels, a), abs=1e-12)
    pos, neg = np.flatnonzero(labels == 1), np.flatnonzero(labels == 0)
    diffs = []
    for _ in range(4000):  # the same resampled images for both models
        rows = np.concatenate([rng.choice(pos, len(pos)), rng.choice(neg, len(neg))])
        y = labels[rows]
        diffs.append(_auc(y, a[rows]) - _auc(y, b[rows]))
    assert result.se == pytest.approx(float(np.std(diffs, ddof=1)), rel=0.15)


def test_one_class_and_tiny_splits_say_why_instead_of_a_number():
    none = paired_auc_difference(np.zeros(5), np.arange(5.0), np.arange(5.0))
    assert none.difference is None and none.lo is None and none.auc_a is None
    assert none.reason == "AUC undefined: no positives" and none.n == 5
    one = paired_auc_difference(np.array([1.0, 0, 0]), np.array([0.9, 0.1, 0.2]), np.zeros(3))
    assert one.difference == pytest.approx(0.5) and one.lo is None and "needs 2" in one.reason
    missing = paired_auc_difference(np.array([1, 0, np.nan, 1, 0]), np.arange(5.0), -np.arange(5.0))
    assert missing.n == 4 and missing.positives == 2


def test_multi_label_is_one_difference_per_label():
    rng = np.random.default_rng(5)
    columns = [_tied_data(rng, 80) for _ in range(3)]
    labels, a, b = (np.stack(parts, axis=1) for parts in zip(*columns, strict=True))
    results = paired_auc_differences(labels, a, b)
    assert [r.difference for r in results] == [
        paired_auc_difference(labels[:, j], a[:, j], b[:, j]).difference for j in range(3)
    ]


# -- the fixed-effect combination of sites' differences (a federation: no pooled AUC) --------
def _site(difference: float | None, se: float | None, n: int = 20) -> PairedDifference:
    lo = None if se is None else difference - 1.96 * se
    hi = None if se is None else difference + 1.96 * se
    return PairedDifference(0.8, 0.7, difference, lo, hi, se, 0.5, n, n // 4)


def test_fixed_effect_is_the_inverse_variance_mean_and_names_its_sites():
    sites = {"a": _site(0.10, 0.05), "b": _site(-0.02, 0.10), "c": _site(0.3, None)}
    combined = fixed_effect(sites)
    w = [1 / 0.05**2, 1 / 0.10**2]
    mean = (w[0] * 0.10 + w[1] * -0.02) / sum(w)
    se = math.sqrt(1 / sum(w))
    assert combined.difference == pytest.approx(mean) and combined.se == pytest.approx(se)
    z = NormalDist().inv_cdf(0.975)
    assert (combined.lo, combined.hi) == pytest.approx((mean - z * se, mean + z * se))
    assert combined.auc_a is None and combined.auc_b is None  # not a pooled AUC
    assert combined.n == 40 and "over a, b" in combined.reason and "left out" in combined.reason
    assert FIXED_EFFECT == "combined (fixed effect)"


def test_fixed_effect_of_identical_models_is_zero_with_zero_width_and_conflicts_are_refused():
    same = fixed_effect({"a": _site(0.0, 0.0), "b": _site(0.0, 0.0)})
    assert (same.difference, same.lo, same.hi, same.se, same.p_value) == (0.0, 0.0, 0.0, 0.0, 1.0)
    mixed = fixed_effect({"a": _site(0.0, 0.0), "b": _site(0.1, 0.05)})
    assert mixed.difference is None and "zero standard error at a" in mixed.reason
    none = fixed_effect({"a": _site(0.1, None)})
    assert none.difference is None and "no site has a DeLong interval" in none.reason
