"""What a clinician reads at an operating point, from binned score counts per label.

A site reports, per label, how many positive and how many negative test images scored in
each score bin (plus the bins' score sums, for calibration and the Brier score): enough for
sensitivity, specificity, PPV and NPV at any bin edge, sensitivity at a target specificity,
a reliability diagram, the Brier score and the AUC, and never a per-image score. Counts of
several sites add up to the pooled counts (``pool``), so pooled figures need no scores either.

Score semantics everywhere: "positive if score ≥ threshold". A threshold must be a bin edge
(``default_edges`` puts the model card's thresholds among them); between edges the counts
cannot say which side an image fell, so such a threshold is refused rather than guessed.

Pure functions on numpy arrays; no store, no dashboard. Stable API used by evaluation jobs:
``ScoreBins``, ``default_edges``, ``score_bins``, ``pool``, ``wilson_ci``, ``at_threshold``,
``sensitivity_at_specificity``, ``auc_from_bins``, ``reliability``, ``brier_score`` and
``figures`` (all of them as one flat dict).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

N_BINS = 1000  # 0.001 wide: fine enough for poorly spread scores, ~30 kB per site and label
EDGE_TOLERANCE = 1e-9
CALIBRATION_GROUPS = 10


@dataclass(frozen=True)
class ScoreBins:
    """Score counts of one label on one split (or pooled over sites).

    ``edges``: increasing, from 0 to 1; bin i is [edges[i], edges[i+1]) (the last bin also
    holds scores of exactly 1). ``positives`` / ``negatives``: images per bin of each class.
    ``positive_sum`` / ``negative_sum``: sum of their scores per bin. ``positive_sq`` /
    ``negative_sq``: sum of squared scores of each class (for the Brier score).
    """

    edges: np.ndarray
    positives: np.ndarray
    negatives: np.ndarray
    positive_sum: np.ndarray
    negative_sum: np.ndarray
    positive_sq: float
    negative_sq: float

    @property
    def n_positive(self) -> int:
        return int(self.positives.sum())

    @property
    def n_negative(self) -> int:
        return int(self.negatives.sum())

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON for the store and for transport."""
        return {
            "edges": self.edges.tolist(),
            "positives": self.positives.astype(int).tolist(),
            "negatives": self.negatives.astype(int).tolist(),
            "positive_sum": self.positive_sum.tolist(),
            "negative_sum": self.negative_sum.tolist(),
            "positive_sq": float(self.positive_sq),
            "negative_sq": float(self.negative_sq),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "score bins") -> ScoreBins:
        """Checked inverse of ``to_dict``; ValueError naming ``where`` and the bad field."""
        try:
            edges = np.asarray(data["edges"], dtype=np.float64)
            arrays = {
                k: np.asarray(data[k], dtype=np.float64)
                for k in ("positives", "negatives", "positive_sum", "negative_sum")
            }
            squares = float(data["positive_sq"]), float(data["negative_sq"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: not score bins ({type(exc).__name__}: {exc})") from None
        _check_edges(edges, where)
        for key, values in arrays.items():
            if values.shape != (len(edges) - 1,):
                raise ValueError(
                    f"{where}: {key} has {values.size} values for {len(edges) - 1} bins"
                )
            if not np.all(np.isfinite(values)) or np.any(values < 0):
                raise ValueError(f"{where}: {key} must be finite and ≥ 0")
        for key in ("positives", "negatives"):
            if np.any(arrays[key] != np.round(arrays[key])):
                raise ValueError(f"{where}: {key} must be whole counts")
        return cls(edges, *arrays.values(), *squares)


def _check_edges(edges: np.ndarray, where: str) -> None:
    if edges.ndim != 1 or len(edges) < 2:
        raise ValueError(f"{where}: edges need at least two values, got {edges.tolist()}")
    if edges[0] != 0.0 or edges[-1] != 1.0 or np.any(np.diff(edges) <= 0):
        raise ValueError(f"{where}: edges must increase strictly from 0 to 1")


def default_edges(thresholds: Iterable[float] = (), n_bins: int = N_BINS) -> np.ndarray:
    """``n_bins`` equal bins on [0, 1] plus the given thresholds (e.g. the model card's), so
    that figures at those thresholds are exact."""
    extra = [float(t) for t in thresholds]
    bad = [t for t in extra if not 0.0 <= t <= 1.0]
    if bad:
        raise ValueError(f"thresholds must lie within [0, 1], got {bad}")
    grid = np.linspace(0.0, 1.0, n_bins + 1)
    extra = [t for t in extra if np.min(np.abs(grid - t)) > EDGE_TOLERANCE]  # no sliver bins
    edges = np.unique(np.concatenate([grid, extra]))
    return edges


def score_bins(labels: np.ndarray, scores: np.ndarray, edges: np.ndarray) -> ScoreBins:
    """Bin one label column: NaN labels (unknown) are skipped; scores must lie in [0, 1]."""
    labels = np.asarray(labels, dtype=np.float64).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    if labels.shape != scores.shape:
        raise ValueError(f"{labels.size} labels but {scores.size} scores")
    edges = np.asarray(edges, dtype=np.float64)
    _check_edges(edges, "score bins")
    known = ~np.isnan(labels)
    y, s = labels[known], scores[known]
    if not np.all(np.isin(y, (0.0, 1.0))):
        raise ValueError(f"labels must be 0, 1 or NaN, got {sorted(set(y.tolist()) - {0.0, 1.0})}")
    if s.size and (not np.all(np.isfinite(s)) or s.min() < 0 or s.max() > 1):
        raise ValueError("scores must be finite and within [0, 1] (sigmoid outputs)")
    index = np.clip(np.searchsorted(edges, s, side="right") - 1, 0, len(edges) - 2)
    n_bins = len(edges) - 1
    pos, neg = y == 1, y == 0

    def count(mask: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        return np.bincount(
            index[mask], weights=None if weights is None else weights[mask], minlength=n_bins
        ).astype(np.float64)

    return ScoreBins(
        edges,
        count(pos),
        count(neg),
        count(pos, s),
        count(neg, s),
        float(np.sum(s[pos] ** 2)),
        float(np.sum(s[neg] ** 2)),
    )


def pool(parts: Sequence[ScoreBins]) -> ScoreBins:
    """The counts of several sites added up (all must share the same edges)."""
    if not parts:
        raise ValueError("nothing to pool")
    edges = parts[0].edges
    for i, part in enumerate(parts[1:], 1):
        if part.edges.shape != edges.shape or not np.allclose(part.edges, edges, atol=0):
            raise ValueError(f"part {i} has other bin edges than part 0: cannot pool")
    return ScoreBins(
        edges,
        sum(p.positives for p in parts),
        sum(p.negatives for p in parts),
        sum(p.positive_sum for p in parts),
        sum(p.negative_sum for p in parts),
        float(sum(p.positive_sq for p in parts)),
        float(sum(p.negative_sq for p in parts)),
    )


def wilson_ci(successes: int, total: int, level: float = 0.95) -> tuple[float, float] | None:
    """Wilson score interval of a proportion (Wilson 1927; Newcombe 1998, method 3); None when
    total is 0. Closed form: thousands per page render, where scipy's binomtest is too slow."""
    if total <= 0:
        return None
    if not 0 <= successes <= total:
        raise ValueError(f"{successes} successes out of {total}")
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p, z2 = successes / total, z * z
    centre = (p + z2 / (2 * total)) / (1 + z2 / total)
    half = z * math.sqrt(p * (1 - p) / total + z2 / (4 * total * total)) / (1 + z2 / total)
    lo = 0.0 if successes == 0 else max(0.0, centre - half)  # exact ends: no rounding at 0 and 1
    hi = 1.0 if successes == total else min(1.0, centre + half)
    return lo, hi


@dataclass(frozen=True)
class Proportion:
    """A proportion with its counts and Wilson CI; ``value`` None when the denominator is 0."""

    successes: int
    total: int
    value: float | None
    lo: float | None
    hi: float | None


def proportion(successes: int, total: int, level: float = 0.95) -> Proportion:
    ci = wilson_ci(successes, total, level)
    if ci is None:
        return Proportion(successes, total, None, None, None)
    return Proportion(successes, total, successes / total, *ci)


@dataclass(frozen=True)
class OperatingPoint:
    """The confusion counts at one threshold and the four figures a clinician reads."""

    threshold: float
    tp: int
    fn: int
    tn: int
    fp: int
    sensitivity: Proportion
    specificity: Proportion
    ppv: Proportion
    npv: Proportion


def edge_index(bins: ScoreBins, threshold: float) -> int:
    """The index of the edge equal to ``threshold``; ValueError naming the nearest edges."""
    edges = bins.edges[:-1]  # "≥ 1" is not an operating point the counts can resolve
    i = int(np.argmin(np.abs(edges - threshold)))
    if abs(edges[i] - threshold) > EDGE_TOLERANCE:
        below = edges[edges < threshold]
        above = edges[edges > threshold]
        near = [float(x) for x in (below[-1:].tolist() + above[:1].tolist())]
        raise ValueError(
            f"threshold {threshold} is not a bin edge of these counts; nearest edges {near}"
        )
    return i


def at_threshold(bins: ScoreBins, threshold: float, level: float = 0.95) -> OperatingPoint:
    """Sensitivity, specificity, PPV and NPV (Wilson CIs) calling "score ≥ threshold"
    positive; ``threshold`` must be a bin edge (see ``edge_index``)."""
    i = edge_index(bins, threshold)
    tp, tn = int(bins.positives[i:].sum()), int(bins.negatives[:i].sum())
    fn, fp = bins.n_positive - tp, bins.n_negative - tn
    return OperatingPoint(
        float(bins.edges[i]),
        tp,
        fn,
        tn,
        fp,
        proportion(tp, tp + fn, level),
        proportion(tn, tn + fp, level),
        proportion(tp, tp + fp, level),
        proportion(tn, tn + fn, level),
    )


def curve(bins: ScoreBins) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(thresholds, sensitivity, specificity) at every usable edge, thresholds increasing;
    NaN sensitivity (specificity) when there are no positives (negatives)."""
    tp = bins.positives[::-1].cumsum()[::-1]  # images with score ≥ edge i
    tn = np.concatenate([[0.0], bins.negatives.cumsum()[:-1]])  # images below edge i
    with np.errstate(invalid="ignore", divide="ignore"):
        sensitivity = tp / bins.n_positive if bins.n_positive else np.full(tp.shape, np.nan)
        specificity = tn / bins.n_negative if bins.n_negative else np.full(tn.shape, np.nan)
    return bins.edges[:-1], sensitivity, specificity


def sensitivity_at_specificity(
    bins: ScoreBins, target: float, level: float = 0.95
) -> OperatingPoint | None:
    """The operating point at the lowest edge whose specificity reaches ``target`` (so the
    highest sensitivity that keeps specificity ≥ target); None without both classes."""
    if not 0.0 < target <= 1.0:
        raise ValueError(f"target specificity must be in (0, 1], got {target}")
    if bins.n_positive == 0 or bins.n_negative == 0:
        return None
    thresholds, _, specificity = curve(bins)
    reach = np.flatnonzero(specificity >= target - EDGE_TOLERANCE)
    if reach.size == 0:  # only "nothing positive" reaches it: every negative has score ≥ 0.99…
        return None
    return at_threshold(bins, float(thresholds[reach[0]]), level)


def auc_from_bins(bins: ScoreBins) -> float | None:
    """Mann–Whitney AUC with images in the same bin counted as ties (exact when no bin holds
    both classes at different scores); None without both classes."""
    if bins.n_positive == 0 or bins.n_negative == 0:
        return None
    below = np.concatenate([[0.0], bins.negatives.cumsum()[:-1]])
    wins = np.sum(bins.positives * (below + 0.5 * bins.negatives))
    return float(wins / (bins.n_positive * bins.n_negative))


@dataclass(frozen=True)
class CalibrationBin:
    """One point of the reliability diagram: scores in [lo, hi)."""

    lo: float
    hi: float
    n: int
    mean_score: float | None
    observed: Proportion


def reliability(bins: ScoreBins, groups: int = CALIBRATION_GROUPS) -> list[CalibrationBin]:
    """Fine bins merged into ``groups`` equal-width score ranges: mean predicted score
    (exact, from the score sums) against the observed fraction of positives (Wilson CI)."""
    left = bins.edges[:-1]
    group = np.minimum((left * groups + EDGE_TOLERANCE).astype(int), groups - 1)
    out = []
    for g in range(groups):
        mask = group == g
        pos, neg = int(bins.positives[mask].sum()), int(bins.negatives[mask].sum())
        total = pos + neg
        sums = float(bins.positive_sum[mask].sum() + bins.negative_sum[mask].sum())
        out.append(
            CalibrationBin(
                g / groups,
                (g + 1) / groups,
                total,
                sums / total if total else None,
                proportion(pos, total),
            )
        )
    return out


def brier_score(bins: ScoreBins) -> float | None:
    """Mean squared error of the scores against the labels, exact from the sums."""
    n = bins.n_positive + bins.n_negative
    if n == 0:
        return None
    positive_error = bins.n_positive - 2 * bins.positive_sum.sum() + bins.positive_sq
    return float((positive_error + bins.negative_sq) / n)


TARGET_SPECIFICITIES = (0.9, 0.95)


def figures(
    bins: ScoreBins, threshold: float, targets: Sequence[float] = TARGET_SPECIFICITIES
) -> dict[str, Any]:
    """Every figure above as flat JSON (for tables, CSV and evaluation reports): counts,
    sensitivity / specificity / PPV / NPV with ``_lo``/``_hi`` at ``threshold``, sensitivity
    and threshold at each target specificity (key suffix ``_at_spec_90`` …), Brier score and
    binned AUC. None where a figure is undefined (one class, or no such operating point)."""
    out: dict[str, Any] = {
        "n_positive": bins.n_positive,
        "n_negative": bins.n_negative,
        "threshold": threshold,
        "auc_binned": auc_from_bins(bins),
        "brier": brier_score(bins),
    }
    op = at_threshold(bins, threshold)
    out.update(tp=op.tp, fn=op.fn, tn=op.tn, fp=op.fp)
    for name in ("sensitivity", "specificity", "ppv", "npv"):
        value: Proportion = getattr(op, name)
        out.update({name: value.value, f"{name}_lo": value.lo, f"{name}_hi": value.hi})
    for target in targets:
        suffix = f"_at_spec_{round(target * 100):d}"
        point = sensitivity_at_specificity(bins, target)
        sens = None if point is None else point.sensitivity
        out[f"sensitivity{suffix}"] = None if sens is None else sens.value
        out[f"sensitivity{suffix}_lo"] = None if sens is None else sens.lo
        out[f"sensitivity{suffix}_hi"] = None if sens is None else sens.hi
        out[f"threshold{suffix}"] = None if point is None else point.threshold
    return out
