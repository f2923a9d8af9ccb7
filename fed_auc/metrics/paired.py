"""The difference of two models' AUCs on the same images, with DeLong's paired interval.

Two runs scored on the same test images are correlated: an interval for each AUC alone says
little about their difference. DeLong, DeLong & Clarke-Pearson (1988) estimate the variance of
the difference from each image's structural components; the midrank form of Sun & Xu (2014)
computes them in O(N log N). The variance is taken of the per-image differences of the
components, which equals S_aa + S_bb − 2·S_ab and is exactly zero for identical scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

DELONG = "DeLong"


@dataclass(frozen=True)
class PairedDifference:
    """AUC of model A minus AUC of model B on the same images of one label, with a
    ``level`` interval; every number None with a ``reason`` where it is undefined."""

    auc_a: float | None
    auc_b: float | None
    difference: float | None
    lo: float | None
    hi: float | None
    se: float | None
    p_value: float | None
    n: int
    positives: int
    level: float = 0.95
    method: str = DELONG
    reason: str = ""


def _midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x``, tied values sharing the mean of their ranks."""
    order = np.argsort(x, kind="mergesort")
    ordered = x[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(x)]
    ranks = np.empty(len(x))
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def _components(pos: np.ndarray, neg: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """AUC and DeLong's structural components V10 (one per positive) and V01 (one per
    negative), by midranks (Sun & Xu 2014, ties counted ½)."""
    m, n = len(pos), len(neg)
    tx, ty = _midranks(pos), _midranks(neg)
    tz = _midranks(np.concatenate([pos, neg]))
    v10 = (tz[:m] - tx) / n
    v01 = 1.0 - (tz[m:] - ty) / m
    return float(v10.mean()), v10, v01


def paired_auc_difference(
    labels: np.ndarray, scores_a: np.ndarray, scores_b: np.ndarray, level: float = 0.95
) -> PairedDifference:
    """AUC(A) − AUC(B) of one label column on the same images (NaN labels ignored), with
    DeLong's ``level`` interval and the two-sided p-value of no difference."""
    labels, a, b = (np.asarray(x, dtype=float).ravel() for x in (labels, scores_a, scores_b))
    if not (len(labels) == len(a) == len(b)):
        raise ValueError(f"{len(labels)} labels but {len(a)} and {len(b)} scores")
    known = ~np.isnan(labels)
    y, a, b = labels[known] == 1, a[known], b[known]
    m, n = int(y.sum()), int((~y).sum())
    if m == 0 or n == 0:
        reason = f"AUC undefined: no {'positives' if m == 0 else 'negatives'}"
        return _undefined(m + n, m, level, reason)
    auc_a, v10_a, v01_a = _components(a[y], a[~y])
    auc_b, v10_b, v01_b = _components(b[y], b[~y])
    difference = auc_a - auc_b
    if m < 2 or n < 2:
        reason = f"no DeLong interval with {m} positive(s) and {n} negative(s): needs 2 of each"
        return PairedDifference(auc_a, auc_b, difference, None, None, None, None, m + n, m,
                                level, reason=reason)  # fmt: skip
    # var(θa − θb) = var(V10a − V10b)/m + var(V01a − V01b)/n; ≥ 0 by construction
    variance = np.var(v10_a - v10_b, ddof=1) / m + np.var(v01_a - v01_b, ddof=1) / n
    se = math.sqrt(max(float(variance), 0.0))
    half = NormalDist().inv_cdf(0.5 + level / 2) * se
    if se > 0:
        p_value = math.erfc(abs(difference) / se / math.sqrt(2))
    else:  # identical ranks of both models: no uncertainty left about the difference
        p_value = 1.0 if difference == 0 else 0.0
    return PairedDifference(auc_a, auc_b, difference, difference - half, difference + half, se,
                            p_value, m + n, m, level)  # fmt: skip


def paired_auc_differences(
    labels: np.ndarray, scores_a: np.ndarray, scores_b: np.ndarray, level: float = 0.95
) -> list[PairedDifference]:
    """``paired_auc_difference`` of every label column of (N, L) labels and scores."""
    labels, a, b = (np.asarray(x, dtype=float) for x in (labels, scores_a, scores_b))
    labels, a, b = (x.reshape(len(x), -1) for x in (labels, a, b))
    return [
        paired_auc_difference(labels[:, j], a[:, j], b[:, j], level) for j in range(labels.shape[1])
    ]


def _undefined(n: int, positives: int, level: float, reason: str) -> PairedDifference:
    return PairedDifference(None, None, None, None, None, None, None, n, positives, level,
                            reason=reason)  # fmt: skip


FIXED_EFFECT = "combined (fixed effect)"  # the name of the one row combined across sites


def fixed_effect(differences: dict[str, PairedDifference], level: float = 0.95) -> PairedDifference:
    """The inverse-variance weighted mean of per-site paired differences (fixed effect).

    Where the images cannot meet (a federation), no pooled AUC exists; this combines the
    sites' differences instead, weighting each by 1/se². It is not a pooled AUC (``auc_a``
    and ``auc_b`` stay None) and says which sites it covers in ``reason``. A site without an
    interval is left out by name; sites whose se is 0 (identical ranks) combine only if they
    all agree, with zero width."""
    usable = {s: d for s, d in differences.items() if d.se is not None}
    left = sorted(set(differences) - set(usable))
    n = sum(d.n for d in (usable or differences).values())  # the images it covers
    positives = sum(d.positives for d in (usable or differences).values())
    about = f"fixed-effect mean of the per-site differences over {', '.join(sorted(usable))}"
    about += f"; left out (no interval): {', '.join(left)}" if left else ""
    if not usable:
        return _undefined(n, positives, level, "no site has a DeLong interval to combine")
    exact = {s: d.difference for s, d in usable.items() if d.se == 0}
    if exact:
        if len(exact) == len(usable) and len(set(exact.values())) == 1:
            value = next(iter(exact.values()))
            return PairedDifference(None, None, value, value, value, 0.0, 1.0 if value == 0
                                    else 0.0, n, positives, level, reason=about)  # fmt: skip
        reason = f"no fixed-effect mean: zero standard error at {', '.join(sorted(exact))}"
        return _undefined(n, positives, level, reason)
    weights = {s: 1.0 / d.se**2 for s, d in usable.items()}
    total = sum(weights.values())
    value = sum(w * usable[s].difference for s, w in weights.items()) / total
    se = math.sqrt(1.0 / total)
    half = NormalDist().inv_cdf(0.5 + level / 2) * se
    p_value = math.erfc(abs(value) / se / math.sqrt(2))
    return PairedDifference(None, None, value, value - half, value + half, se, p_value, n,
                            positives, level, reason=about)  # fmt: skip
