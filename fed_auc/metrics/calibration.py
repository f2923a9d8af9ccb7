"""A calibration map from a model's score to a probability: isotonic regression on pooled
validation labels and scores, kept as the step function's breakpoints (knots).

The AUC-trained network's sigmoid score ranks well but is not a probability (an AUC loss
never asks it to be one). A monotone map fitted on validation data turns it into one without
changing the ranking, so the AUC and the card's threshold keep their meaning. The knots are
small plain numbers: they travel in the model card and in every exported format, and
``apply_calibration`` (``np.interp`` over them) is all a deployment needs to apply them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

METHOD = "isotonic"


def calibration_note(labels: np.ndarray) -> str | None:
    """Why no map can be fitted to these labels (NaN: unknown), or None when one can."""
    y = np.asarray(labels, dtype=float)
    y = y[~np.isnan(y)]
    if len(y) == 0:
        return "no labelled validation images"
    if y.min() == y.max():
        return f"pooled validation has no {'negatives' if y.min() == 1 else 'positives'}"
    return None


def fit_calibration(
    labels: np.ndarray, scores: np.ndarray, sites: list[str]
) -> dict[str, Any] | None:
    """A monotone (isotonic, clipped at the ends) map score → probability fitted on one
    label's pooled validation ``labels`` (0/1, NaN unknown) and ``scores`` of ``sites``; None
    where the labels have one class (``calibration_note`` says which)."""
    from sklearn.isotonic import IsotonicRegression

    y = np.asarray(labels, dtype=float)
    s = np.asarray(scores, dtype=float)
    if y.shape != s.shape:
        raise ValueError(f"labels {y.shape} and scores {s.shape} differ in shape")
    known = ~np.isnan(y)
    y, s = y[known], s[known]
    if calibration_note(y) is not None:
        return None
    iso = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(s, y)
    return {
        "method": METHOD,
        "fitted_on": f"pooled validation, sites {list(sites)}",
        "n": int(len(y)),
        "positives": int(y.sum()),
        # the breakpoints of the fitted step function: np.interp over them is iso.predict
        "x": [float(v) for v in iso.X_thresholds_],
        "y": [float(v) for v in iso.y_thresholds_],
    }


def apply_calibration(scores: np.ndarray, entry: dict[str, Any]) -> np.ndarray:
    """Probabilities for one label's ``scores`` from its calibration ``entry`` (the card's
    ``calibration`` item): linear between the knots, constant beyond the ends; monotone."""
    if entry.get("method") != METHOD:
        reason = entry.get("note") or f"method {entry.get('method')!r}"
        raise ValueError(f"label {entry.get('label')!r}: no {METHOD} calibration map ({reason})")
    x, y = np.asarray(entry["x"], dtype=float), np.asarray(entry["y"], dtype=float)
    if len(x) == 0 or x.shape != y.shape or np.any(np.diff(x) < 0) or np.any(np.diff(y) < 0):
        raise ValueError(f"label {entry.get('label')!r}: calibration knots are not monotone")
    return np.interp(np.asarray(scores, dtype=float), x, y)
