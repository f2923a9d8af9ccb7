"""Statistics of one label's scores: Youden threshold, bootstrap CIs, calibration rows, the per-
label result and the worst site.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.metrics import roc_curve

from fed_auc.metrics.auc import auc_of
from fed_auc.metrics.operating_point import (
    ScoreBins,
    default_edges,
    figures,
    reliability,
    score_bins,
)
from fed_auc.metrics.pooled import binned_aucs, percentile_interval
from fed_auc.metrics.roc import roc_points

POOLED = "pooled"
BOOTSTRAP_CHUNK = 200  # resamples scored at once (memory: 200 × n counts)


def youden_threshold(labels: np.ndarray, scores: np.ndarray) -> float:
    """Score threshold maximising sensitivity + specificity − 1 (0.5 with one class)."""
    known = ~np.isnan(labels)
    y, s = labels[known].astype(int), scores[known]
    if len(y) == 0 or y.min() == y.max():
        return 0.5
    fpr, tpr, thresholds = roc_curve(y, s)
    return float(min(thresholds[int(np.argmax(tpr - fpr))], 1.0))


def bootstrap_ci(
    labels: np.ndarray, scores: np.ndarray, n_boot: int, seed: int = 0, level: float = 0.95
) -> tuple[float | None, float | None]:
    """Percentile bootstrap CI of the AUC (resamples with one class are skipped).

    Each resample's AUC is the Mann–Whitney count over the distinct scores (ties count ½, as
    in sklearn's ``roc_auc_score``), for ``BOOTSTRAP_CHUNK`` resamples at once: a node's
    bootstrap costs milliseconds, not one sklearn call per resample."""
    if n_boot <= 0:
        return None, None
    labels = np.asarray(labels).astype(int)
    _, tie = np.unique(np.asarray(scores), return_inverse=True)
    n, distinct = len(labels), int(tie.max()) + 1 if len(labels) else 0
    rng = np.random.default_rng(seed)
    values = []
    for start in range(0, n_boot, BOOTSTRAP_CHUNK):
        k = min(BOOTSTRAP_CHUNK, n_boot - start)
        idx = rng.integers(0, n, (k, n))
        cells = tie[idx] + distinct * labels[idx] + 2 * distinct * np.arange(k)[:, None]
        counts = np.bincount(cells.ravel(), minlength=2 * distinct * k).reshape(k, 2, distinct)
        values.append(binned_aucs(counts[:, 1].astype(float), counts[:, 0].astype(float)))
    return percentile_interval(np.concatenate(values), level)


def calibration_rows(bins: ScoreBins) -> list[dict[str, Any]]:
    """The reliability diagram of ``bins`` as JSON rows (observed rate with its Wilson CI)."""
    return [
        {"lo": c.lo, "hi": c.hi, "n": c.n, "mean_score": c.mean_score,
         "observed": c.observed.value, "observed_lo": c.observed.lo, "observed_hi": c.observed.hi}
        for c in reliability(bins)
    ]  # fmt: skip


def label_result(
    labels: np.ndarray, scores: np.ndarray, threshold: float, n_boot: int, seed: int
) -> dict[str, Any]:
    """Everything reported for one label on one site."""
    known = ~np.isnan(labels)
    y, s = labels[known].astype(int), scores[known]
    result = auc_of(labels, scores)
    positives = int(y.sum())
    out: dict[str, Any] = {
        "n": int(len(y)),
        "positives": positives,
        "prevalence": positives / len(y) if len(y) else None,
        "auc": result.auc,
        "ci_lo": None,
        "ci_hi": None,
        "note": result.reason,
        "threshold": threshold,
        "sensitivity": float((s[y == 1] >= threshold).mean()) if positives else None,
        "specificity": float((s[y == 0] < threshold).mean()) if len(y) > positives else None,
        "roc": None,
    }
    bins = score_bins(y, s, default_edges([threshold]))
    if threshold < 1.0:  # "score ≥ 1" is no operating point the bins can resolve
        clinical = figures(bins, threshold)
        out.update({k: v for k, v in clinical.items() if k not in out})
    out["calibration"] = calibration_rows(bins)
    out["bins"] = bins.to_dict()
    if result.auc is not None:
        out["ci_lo"], out["ci_hi"] = bootstrap_ci(y, s, n_boot, seed)
        points = roc_points(y.astype(float), s)  # ≤ 101 points: what a node may send
        out["roc"] = {"fpr": points["fpr"], "tpr": points["tpr"], "threshold": points["thresholds"]}
    return out


def worst_site_auc(per_site: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """Per label, the site with the lowest defined AUC (the pooled entry excluded)."""
    worst_of = {}
    for label in names:
        defined = {
            site: r[label]["auc"]
            for site, r in per_site.items()
            if site != POOLED and r[label]["auc"] is not None
        }
        worst = min(defined, key=defined.get) if defined else None
        worst_of[label] = (
            {"site": worst, "auc": defined[worst]} if worst else {"site": None, "auc": None}
        )
    return worst_of
