"""AUC with a confidence interval, per label, with an explicit reason when it is undefined."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from sklearn.metrics import roc_auc_score


@dataclass(frozen=True)
class AUCResult:
    """AUC of one label on one split; ``auc`` is None with a ``reason`` when undefined."""

    auc: float | None
    lo: float | None
    hi: float | None
    n: int
    positives: int
    reason: str = ""


def hanley_mcneil_ci(
    auc: float, positives: int, negatives: int, level: float = 0.95
) -> tuple[float, float]:
    """Closed-form CI of Hanley & McNeil (1982): cheap enough for every round and site.

    Batch evaluation (``fed-auc evaluate``) uses the bootstrap instead.
    """
    q1 = auc / (2 - auc)
    q2 = 2 * auc**2 / (1 + auc)
    var = (auc * (1 - auc) + (positives - 1) * (q1 - auc**2) + (negatives - 1) * (q2 - auc**2)) / (
        positives * negatives
    )
    half = NormalDist().inv_cdf(0.5 + level / 2) * math.sqrt(max(var, 0.0))
    return max(0.0, auc - half), min(1.0, auc + half)


def auc_of(labels: np.ndarray, scores: np.ndarray) -> AUCResult:
    """ROC AUC of one label column (NaN labels are ignored)."""
    known = ~np.isnan(labels)
    y, s = labels[known].astype(int), scores[known]
    positives = int(y.sum())
    negatives = int(len(y) - positives)
    if positives == 0 or negatives == 0:
        missing = "positives" if positives == 0 else "negatives"
        return AUCResult(None, None, None, len(y), positives, f"AUC undefined: no {missing}")
    auc = float(roc_auc_score(y, s))
    lo, hi = hanley_mcneil_ci(auc, positives, negatives)
    return AUCResult(auc, lo, hi, len(y), positives)


def per_label_auc(labels: np.ndarray, scores: np.ndarray) -> list[AUCResult]:
    """AUC of every label column of (N, L) labels and scores."""
    return [auc_of(labels[:, j], scores[:, j]) for j in range(labels.shape[1])]


def mean_auc(results: list[AUCResult]) -> float | None:
    """Mean AUC over the labels where it is defined (None if none is)."""
    defined = [r.auc for r in results if r.auc is not None]
    return float(np.mean(defined)) if defined else None
