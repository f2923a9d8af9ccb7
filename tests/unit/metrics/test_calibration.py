"""The calibration map (isotonic, pooled validation): properties, not a copy of the formula."""

from __future__ import annotations

import numpy as np
import pytest

from fed_auc.metrics.calibration import apply_calibration, calibration_note, fit_calibration


def _entry(labels, scores):
    fit = fit_calibration(labels, scores, ["a", "b"])
    assert fit is not None
    return {"label": "x", **fit}


def test_the_map_is_monotone_and_gives_probabilities():
    rng = np.random.default_rng(0)
    scores = rng.random(400) ** 3  # an AUC-trained score: ranks, not probabilities
    labels = (rng.random(400) < 0.2 + 0.6 * scores).astype(float)
    entry = _entry(labels, scores)
    grid = np.linspace(-0.5, 1.5, 2001)  # beyond the fitted range too: clipped
    probs = apply_calibration(grid, entry)
    assert np.all(np.diff(probs) >= 0)
    assert probs.min() >= 0 and probs.max() <= 1
    assert entry["n"] == 400 and entry["positives"] == int(labels.sum())
    assert entry["fitted_on"] == "pooled validation, sites ['a', 'b']"
    assert len(entry["x"]) < 100  # the breakpoints only, not every validation score


def test_a_perfectly_calibrated_score_maps_close_to_itself():
    rng = np.random.default_rng(1)
    scores = rng.random(20000)
    labels = (rng.random(20000) < scores).astype(float)
    grid = np.linspace(0.05, 0.95, 19)
    assert np.max(np.abs(apply_calibration(grid, _entry(labels, scores)) - grid)) < 0.05


def test_calibration_keeps_the_ranking_and_reads_unknown_labels_as_unknown():
    rng = np.random.default_rng(2)
    scores = rng.random(300)
    labels = (rng.random(300) < scores).astype(float)
    with_unknown = labels.copy()
    with_unknown[:50] = np.nan
    entry = _entry(with_unknown, scores)
    assert entry["n"] == 250
    order = np.argsort(scores)
    assert np.all(np.diff(apply_calibration(scores[order], entry)) >= 0)


@pytest.mark.parametrize(("value", "missing"), [(0.0, "positives"), (1.0, "negatives")])
def test_one_class_has_no_map_and_says_why(value, missing):
    labels, scores = np.full(20, value), np.linspace(0, 1, 20)
    assert fit_calibration(labels, scores, ["a"]) is None
    assert calibration_note(labels) == f"pooled validation has no {missing}"
    entry = {"label": "x", "method": None, "note": calibration_note(labels)}
    with pytest.raises(ValueError, match=f"label 'x': no isotonic calibration map .*{missing}"):
        apply_calibration(scores, entry)
