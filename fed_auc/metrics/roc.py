"""ROC points per label, small enough to store every round (never per-image scores).

The dashboard's ROC page draws these curves and reads sensitivity / specificity at a chosen
threshold off them, so the stored points must keep their thresholds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.metrics import roc_curve

MAX_POINTS = 101


def roc_points(
    labels: np.ndarray, scores: np.ndarray, max_points: int = MAX_POINTS
) -> dict[str, Any]:
    """fpr, tpr and thresholds of one label column, at most ``max_points`` of them.

    A point means "positive if score ≥ threshold". sklearn's first threshold is +inf (nothing
    positive); it is stored as the next float above the top score so the result is plain
    JSON. NaN labels are ignored. With one class only, the curve is undefined: empty lists
    and a ``reason``.
    """
    known = ~np.isnan(labels)
    y, s = labels[known].astype(int), scores[known].astype(np.float64)
    if y.min(initial=1) == y.max(initial=0):
        missing = "positives" if y.sum() == 0 else "negatives"
        return {"fpr": [], "tpr": [], "thresholds": [], "reason": f"no {missing}"}
    fpr, tpr, thresholds = roc_curve(y, s)
    thresholds[0] = np.nextafter(thresholds[1], np.inf)
    if len(fpr) > max_points:
        keep = _spread(thresholds, max_points)
        fpr, tpr, thresholds = fpr[keep], tpr[keep], thresholds[keep]
    return {"fpr": fpr.tolist(), "tpr": tpr.tolist(), "thresholds": thresholds.tolist()}


def _spread(thresholds: np.ndarray, max_points: int) -> np.ndarray:
    """Indices to keep: both ends, half evenly along the curve, half evenly in threshold.

    Even steps along the curve keep its shape; even steps in threshold keep the slider's
    interpolation accurate where the curve has few, far-apart thresholds.
    """
    last = len(thresholds) - 1
    along = np.round(np.linspace(0, last, max_points // 2 + 1)).astype(int)
    targets = np.linspace(thresholds[-1], thresholds[1], max_points - len(along))
    ascending = thresholds[::-1]  # roc_curve's thresholds decrease
    nearest = last - np.clip(np.searchsorted(ascending, targets), 0, last)
    return np.unique(np.concatenate([along, nearest]))


def per_label_roc(labels: np.ndarray, scores: np.ndarray) -> list[dict[str, Any]]:
    """ROC points of every label column of (N, L) labels and scores."""
    return [roc_points(labels[:, j], scores[:, j]) for j in range(labels.shape[1])]


def operating_point(roc: dict[str, Any], threshold: float) -> tuple[float, float] | None:
    """(sensitivity, specificity) at ``threshold``, interpolated linearly between stored points.

    None when the curve is undefined. Above the top stored threshold nothing is called
    positive (0, 1); below the lowest everything is (1, 0).
    """
    if not roc.get("thresholds"):
        return None
    order = np.argsort(roc["thresholds"], kind="stable")  # np.interp needs increasing x
    x = np.asarray(roc["thresholds"])[order]
    tpr = float(np.interp(threshold, x, np.asarray(roc["tpr"])[order]))
    fpr = float(np.interp(threshold, x, np.asarray(roc["fpr"])[order]))
    return tpr, 1.0 - fpr
