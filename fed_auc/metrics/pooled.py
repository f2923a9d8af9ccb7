"""Pooled AUC over sites that never pool their scores: from the sites' binned score counts.

Each site sends, per label, how many positive and negative test images fell in each score bin
(``metrics.operating_point.ScoreBins``). Added up, the counts give the pooled Mann–Whitney AUC
with images in the same bin counted as ties (``auc_from_bins``). Why that is close enough, and
how close: a (positive, negative) pair in different bins is ordered exactly as its scores are
(bins are disjoint intervals); only a pair in the same bin may be wrong, and by at most 1/2 (the
exact pair counts 0, 1/2 or 1, the binned one 1/2). So

    |AUC_binned − AUC_exact| ≤ ½ · Σ_b P_b · N_b / (P · N)

(``binning_error_bound``), a worst case the counts alone state; it is attained when every
same-bin pair is ordered the same way. The CI resamples the pooled counts (a multinomial draw of
n images over the (bin, class) cells): the percentile bootstrap of images whose scores are known
to bin resolution.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fed_auc.metrics.operating_point import ScoreBins, auc_from_bins, pool

BOOTSTRAP_CHUNK = 250  # resamples drawn at once: bounds memory at 250 × occupied cells


def binning_error_bound(bins: ScoreBins) -> float | None:
    """The largest possible |binned − exact| AUC for any scores these counts could come from;
    None without both classes."""
    if bins.n_positive == 0 or bins.n_negative == 0:
        return None
    same_bin = float(np.sum(bins.positives * bins.negatives))
    return 0.5 * same_bin / (bins.n_positive * bins.n_negative)


def _occupied(bins: ScoreBins) -> tuple[np.ndarray, np.ndarray]:
    """Positive and negative counts of the bins that hold any image, in score order."""
    keep = (bins.positives + bins.negatives) > 0
    return bins.positives[keep], bins.negatives[keep]


def binned_aucs(positives: np.ndarray, negatives: np.ndarray) -> np.ndarray:
    """Binned AUC of each row of (R, B) count matrices; NaN where a row lacks a class."""
    below = np.cumsum(negatives, axis=1) - negatives
    wins = np.sum(positives * (below + 0.5 * negatives), axis=1)
    pairs = positives.sum(axis=1) * negatives.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(pairs > 0, wins / np.maximum(pairs, 1), np.nan)


def bootstrap_bins_ci(
    bins: ScoreBins, n_boot: int, seed: int = 0, level: float = 0.95
) -> tuple[float | None, float | None]:
    """Percentile CI of the binned AUC from ``n_boot`` multinomial resamples of the counts
    (resamples with one class are skipped, as in ``fed_auc.metrics.report.bootstrap_ci``)."""
    if n_boot <= 0 or bins.n_positive == 0 or bins.n_negative == 0:
        return None, None
    pos, neg = _occupied(bins)
    cells = np.concatenate([pos, neg])
    n = int(cells.sum())
    rng = np.random.default_rng(seed)
    values = []
    for start in range(0, n_boot, BOOTSTRAP_CHUNK):
        draws = rng.multinomial(n, cells / n, size=min(BOOTSTRAP_CHUNK, n_boot - start))
        values.append(binned_aucs(draws[:, : len(pos)], draws[:, len(pos) :]))
    return percentile_interval(np.concatenate(values), level)


def percentile_interval(aucs: np.ndarray, level: float) -> tuple[float | None, float | None]:
    """The bootstrap's percentile interval at ``level`` over the defined (non-NaN) AUCs;
    (None, None) when no resample had both classes."""
    aucs = aucs[~np.isnan(aucs)]
    if aucs.size == 0:
        return None, None
    tail = (1 - level) / 2 * 100
    return float(np.percentile(aucs, tail)), float(np.percentile(aucs, 100 - tail))


def pooled_from_bins(
    parts: dict[str, ScoreBins], n_boot: int, seed: int = 0
) -> tuple[ScoreBins, dict[str, Any]]:
    """The sites' counts added up, and the pooled AUC, its CI, the binning's error bound and
    the sites it covers (a one-class site still adds its images)."""
    pooled = pool(list(parts.values()))
    lo, hi = bootstrap_bins_ci(pooled, n_boot, seed)
    return pooled, {
        "auc": auc_from_bins(pooled),
        "ci_lo": lo,
        "ci_hi": hi,
        "auc_error_bound": binning_error_bound(pooled),
        "sites": sorted(parts),
    }


def roc_from_bins(bins: ScoreBins, max_points: int = 101) -> dict[str, list[float]] | None:
    """ROC points at the bin edges (at most ``max_points``, evenly along the occupied edges);
    None without both classes."""
    if bins.n_positive == 0 or bins.n_negative == 0:
        return None
    tp = bins.positives[::-1].cumsum()[::-1]
    fp = bins.negatives[::-1].cumsum()[::-1]
    edges = bins.edges[:-1]
    keep = np.flatnonzero((bins.positives + bins.negatives) > 0)  # edges where the curve moves
    keep = keep[np.unique(np.round(np.linspace(0, len(keep) - 1, max_points - 1)).astype(int))]
    fpr = np.concatenate([[0.0], fp[keep][::-1] / bins.n_negative])
    tpr = np.concatenate([[0.0], tp[keep][::-1] / bins.n_positive])
    threshold = np.concatenate([[1.0], edges[keep][::-1]])
    return {"fpr": fpr.tolist(), "tpr": tpr.tolist(), "threshold": threshold.tolist()}


def check_same_edges(parts: Sequence[ScoreBins], names: Sequence[str]) -> None:
    """Pooling needs one binning: name the first site whose edges differ (another threshold)."""
    for part, name in zip(parts[1:], names[1:], strict=True):
        if part.edges.shape != parts[0].edges.shape or np.any(part.edges != parts[0].edges):
            raise ValueError(
                f"site {name}: score bins differ from site {names[0]}'s (another threshold?)"
            )
