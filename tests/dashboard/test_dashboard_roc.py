"""ROC points stored for the dashboard: small, exact at the ends, readable at any threshold."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fed_auc.experiment.config import ExperimentConfig
from fed_auc.metrics.roc import MAX_POINTS, operating_point, per_label_roc, roc_points
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore


def _sample(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = (rng.random(n) < 0.3).astype(float)
    return labels, rng.random(n) * 0.6 + labels * 0.3


def _true_point(labels: np.ndarray, scores: np.ndarray, t: float) -> tuple[float, float]:
    positive = scores >= t
    sens = (positive & (labels == 1)).sum() / (labels == 1).sum()
    spec = (~positive & (labels == 0)).sum() / (labels == 0).sum()
    return float(sens), float(spec)


@pytest.mark.parametrize("n", [40, 3000])
def test_roc_points_are_few_monotone_and_span_the_whole_curve(n):
    labels, scores = _sample(n)
    roc = roc_points(labels, scores)
    fpr, tpr, thr = map(np.asarray, (roc["fpr"], roc["tpr"], roc["thresholds"]))
    assert 2 <= len(fpr) <= MAX_POINTS and len(fpr) == len(tpr) == len(thr)
    assert (np.diff(fpr) >= 0).all() and (np.diff(tpr) >= 0).all() and (np.diff(thr) < 0).all()
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert thr[0] > scores.max() and np.isfinite(thr).all()
    assert _true_point(labels, scores, thr[0]) == (0.0, 1.0)


@pytest.mark.parametrize("n", [40, 3000])
def test_operating_point_is_exact_at_stored_thresholds_and_close_between(n):
    labels, scores = _sample(n, seed=1)
    roc = roc_points(labels, scores)
    for point in roc["thresholds"]:
        assert operating_point(roc, point) == pytest.approx(_true_point(labels, scores, point))
    assert operating_point(roc, 1.5) == (0.0, 1.0) and operating_point(roc, -1) == (1.0, 0.0)
    if n == 3000:  # downsampled to 101 points; dense enough that interpolation stays close
        worst = max(
            abs(a - b)
            for t in np.linspace(0.0, 1.0, 101)
            for a, b in zip(operating_point(roc, t), _true_point(labels, scores, t), strict=True)
        )
        assert worst < 0.03


def test_roc_is_undefined_with_one_class_and_ignores_unknown_labels():
    roc = roc_points(np.array([0.0, 0.0, np.nan]), np.array([0.1, 0.2, 0.9]))
    assert roc["fpr"] == [] and roc["reason"] == "no positives"
    assert operating_point(roc, 0.5) is None
    labels = np.array([[1, 0], [0, np.nan], [1, 1], [0, 0]], dtype=float)
    scores = np.array([[0.9, 0.2], [0.1, 0.99], [0.8, 0.7], [0.3, 0.1]])
    both = per_label_roc(labels, scores)
    assert both[0]["tpr"][-1] == 1.0 and both[1]["tpr"] == [0.0, 1.0, 1.0]


def test_a_simulated_round_stores_each_sites_roc_consistent_with_its_auc(tmp_path):
    config = ExperimentConfig(
        runs_dir=str(tmp_path), sites=2, rounds=1, local_steps=1, batch_size=8, data_scale=0.15
    )
    summary = run_simulation(config)
    with RunStore(tmp_path) as store:
        rows = store.site_rounds(summary["run_id"])
    for _, row in rows.iterrows():
        roc = json.loads(row["metrics"])["roc"]
        assert len(roc) == 1 and len(roc[0]["fpr"]) <= MAX_POINTS
        area = float(np.trapezoid(roc[0]["tpr"], roc[0]["fpr"]))
        assert area == pytest.approx(row["auc"], abs=0.02)
