"""The exported model's scores reach the store as binned counts per label (never per-image
scores), at the model card's threshold, consistent with the AUC each site reports."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fed_auc.exchange import Evaluation, SplitEvaluation
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.metrics.operating_point import (
    ScoreBins,
    at_threshold,
    auc_from_bins,
    default_edges,
    score_bins,
)
from fed_auc.run.lifecycle import EXPORTED
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore
from fed_auc.transport.flower.codec import evaluation_frame, frame_evaluation


def test_a_run_stores_the_exported_models_bins_at_the_cards_threshold(tmp_path):
    config = ExperimentConfig(
        runs_dir=str(tmp_path), sites=3, rounds=2, local_steps=1, batch_size=8, data_scale=0.15
    )
    summary = run_simulation(config)
    card = json.loads((tmp_path / summary["run_id"] / "model" / "model_card.json").read_text())
    with RunStore(tmp_path) as store:
        run = store.run(summary["run_id"])
        rows = store.model_evaluations(summary["run_id"])
        sites = store.site_rounds(summary["run_id"])
    assert run["summary"]["threshold"] == card["threshold"]
    # the calibration map is fitted on the same pooled validation scores as the threshold
    (calibration,) = card["calibration"]
    assert calibration["label"] == card["label_names"][0]
    assert calibration["method"] == "isotonic" and calibration["n"] > calibration["positives"] > 0
    assert calibration["fitted_on"] == f"pooled validation, sites {sorted(sites['site'].unique())}"
    assert calibration["x"] == sorted(calibration["x"]) and calibration["y"] == sorted(
        calibration["y"]
    )
    assert 0 <= calibration["y"][0] <= calibration["y"][-1] <= 1
    assert card["secure_aggregation"] is False
    assert set(rows["model"]) == {EXPORTED} and set(rows["split"]) == {"test"}
    assert sorted(rows["site"]) == sorted(sites["site"].unique())
    selected = sites[sites["round"] == run["summary"]["selected_round"]].set_index("site")
    for _, row in rows.iterrows():
        (label,) = json.loads(row["labels"])
        bins = ScoreBins.from_dict(label["bins"], where=row["site"])
        assert (
            bins.n_positive + bins.n_negative == label["n"] == selected.loc[row["site"], "n_test"]
        )
        assert bins.n_positive == label["positives"]
        assert label["threshold"] == card["threshold"][0]
        assert at_threshold(bins, label["threshold"]).threshold == label["threshold"]
        if label["auc"] is not None:  # the same model as the selected round: the same AUC
            assert label["auc"] == pytest.approx(selected.loc[row["site"], "auc"], abs=1e-9)
            # pairs in one bin count ½ in the bins, 0 or 1 in truth: that bounds the difference
            tied = np.sum(bins.positives * bins.negatives) / (bins.n_positive * bins.n_negative)
            assert abs(auc_from_bins(bins) - label["auc"]) <= tied / 2 + 1e-12


def test_bins_travel_through_the_flower_codec_unchanged():
    rng = np.random.default_rng(0)
    labels, scores = (rng.random(40) < 0.4).astype(float), rng.random(40)
    bins = score_bins(labels, scores, default_edges([0.3705])).to_dict()
    split = SplitEvaluation(n=40, positives=[int(labels.sum())], aucs=[], bins=[bins])
    back = frame_evaluation(evaluation_frame(Evaluation("a", {"test": split})))
    assert back.splits["test"].bins == [bins]
