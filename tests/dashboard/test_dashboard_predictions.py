"""The Evaluations page lists the prediction jobs that used the picked run's model: counts,
positives named by label, class and threshold, where the files are; nothing per image."""

from __future__ import annotations

from app import predictions_data
from fed_auc.store.run_store import RunStore
from tests.support.apptest import open_page

JOB = {
    "model": "/runs/train-1/model/model.pt", "model_run_id": "train-1", "model_sha256": "ab" * 32,
    "label_names": ["finding"], "positive_class": ["malignant"], "thresholds": [0.42],
    "input": "folder /data/new", "n_images": 12, "n_failed": 1, "positives": [4],
    "output": "/out/p.csv", "sr_dir": "/out/sr", "sr_count": 3, "calibrated": 0,
}  # fmt: skip


def test_a_prediction_job_is_listed_on_its_models_run(monkeypatch, tmp_path):
    with RunStore(tmp_path) as store:
        run = store.create_run("codasca", {"transport": "local"}, None, run_id="train-1")
        other = store.create_run("codasca", {"transport": "local"}, None, run_id="train-2")
        job = store.record_prediction(JOB)
    (shown,) = predictions_data.readable_jobs(
        predictions_data.prediction_jobs(tmp_path, run)
    ).to_dict("records")
    assert shown["positive at threshold"] == "finding (malignant) ≥ 0.42: 4"
    assert (shown["images"], shown["not read"], shown["SRs"]) == (12, 1, "3 in /out/sr")
    assert shown["job"] == job
    assert predictions_data.prediction_jobs(tmp_path, other).empty

    at = open_page(monkeypatch, tmp_path, "evaluations", run)
    assert "Prediction jobs" in [h.value for h in at.subheader]
    table = at.dataframe[-1].value
    assert table["job"].tolist() == [job] and table["images"].tolist() == [12]
    at = open_page(monkeypatch, tmp_path, "evaluations", other)
    assert any("No `fed-auc predict` job" in c.value for c in at.caption)
