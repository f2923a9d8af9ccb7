"""The Evaluations page: a recorded evaluation job as a forest plot, held-out sites marked,
the pooled AUC naming its sites, sites that did not report, the operating-point table."""

from __future__ import annotations

import numpy as np
import pytest

from app import evaluations_data
from fed_auc.evaluate.job import combine
from fed_auc.exchange import EvaluationRequest, NodeFailure
from fed_auc.metrics.report import label_result
from fed_auc.store.run_store import RunStore
from tests.support.apptest import open_page

SITES = {"north": (80, 0.3), "south": (60, 0.5), "east": (40, 0.0)}  # east: no positives


def _report(site: str, n: int, prevalence: float, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < prevalence).astype(float)
    s = np.clip(rng.normal(0.4 + 0.25 * y, 0.15), 0, 1)
    return {"site": site, "splits": {"test": {"finding": label_result(y, s, 0.5, 200, 0)}}}


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs")
    request = EvaluationRequest("fed-auc-model/1", {}, ["finding"], [0.5], "none", ["test"], 200, 0)
    answers = {s: _report(s, n, p, i) for i, (s, (n, p)) in enumerate(SITES.items())}
    answers["west"] = NodeFailure("west", "dropped", "no answer within 60 s")
    result = combine(answers, request, "test", held_out=["south"])
    result.update(model="models/demo", model_run_id="train-1", transport="flower")
    with RunStore(path) as store:
        job = store.create_run("evaluate", {"transport": "flower"}, None)
        store.record_evaluation(job, "test", result)
        empty = store.create_run("evaluate", {"transport": "flower"}, None)
    return path, job, empty, result


def test_the_forest_rows_are_the_stored_aucs_with_the_held_out_site_marked(store_dir):
    path, job, _, result = store_dir
    jobs = evaluations_data.jobs(path, job)
    rows = evaluations_data.site_rows(path, job, "test")
    frame = evaluations_data.forest(jobs.iloc[0], rows, "finding").set_index("site")
    assert frame.loc["south", "kind"] == "held out" and frame.loc["north", "kind"] == "trained on"
    assert frame.loc["north", "auc"] == result["sites"]["north"]["finding"]["auc"]
    assert frame.loc["east", "note"] == "AUC undefined: no positives"
    pooled = frame[frame["kind"] == "pooled"]
    assert pooled.index[0] == "pooled (east, north, south)"  # names the sites it covers
    assert pooled["error_bound"].iloc[0] >= 0
    assert evaluations_data.failures(jobs.iloc[0]).values.tolist() == [
        ["west", "dropped: no answer within 60 s"]
    ]


def test_the_page_draws_the_job_and_names_what_did_not_report(monkeypatch, store_dir):
    path, job, _, _ = store_dir
    at = open_page(monkeypatch, path, "evaluations", job)
    assert at.title[0].value == "Evaluations"
    assert len(at.get("vega_lite_chart")) == 1
    caption = " ".join(c.value for c in at.caption)
    assert "held out (never trained on): south" in caption and "over Flower" in caption
    assert any("west (dropped: no answer within 60 s)" in w.value for w in at.warning)
    tables = at.dataframe
    assert len(tables) == 4  # the forest's numbers and the operating point's three tables
    operating = tables[1].value
    assert set(operating["site"]) == {"north", "south", "east", "pooled"}


def test_a_run_without_an_evaluation_job_says_so(monkeypatch, store_dir):
    path, _, empty, _ = store_dir
    at = open_page(monkeypatch, path, "evaluations", empty)
    assert "No evaluation job recorded under this run" in at.info[0].value


def test_a_job_is_listed_on_the_run_whose_model_it_scored(store_dir):
    path, job, empty, _ = store_dir
    scored = evaluations_data.jobs(path, "train-1")  # the model card's run_id
    assert scored["run_id"].tolist() == [job] and scored["split"].tolist() == ["test"]
    assert evaluations_data.jobs(path, job)["run_id"].tolist() == [job]
    assert evaluations_data.jobs(path, empty).empty
