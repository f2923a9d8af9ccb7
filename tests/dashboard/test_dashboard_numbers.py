"""One number per quantity, for a clinician: the same model's same split shows one AUC and one
interval wherever it appears, each interval names its method, every table reads as numbers at
one precision with "—" where there is none, and every AUC axis and column names its positive
class (a cropped screenshot still says it)."""

from __future__ import annotations

import json

import pytest

from app import evaluations_data, queries
from app.model_view import EXPORTED, choices, site_status
from fed_auc.metrics.wording import BINNED_BOOTSTRAP, BOOTSTRAP, HANLEY_MCNEIL
from fed_auc.store.run_store import RunStore
from tests.dashboard.test_dashboard_clinical import charts_of
from tests.support.apptest import metrics, open_page, texts
from tests.support.dashboard_store import fill, fill_evaluation_job

POSITIVE = "finding present"  # the fixture cards' positive class
RAW = {"ci_lo", "ci_hi", "error_bound", "final_auc", "auc_lo", "auc_hi", "CI low", "CI high"}


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    """``fill``'s runs and an evaluation job (its own run) that scored run-complete's export."""
    path = tmp_path_factory.mktemp("runs")
    fill(path)
    job = fill_evaluation_job(path, "run-complete", held_out=("south",))
    return path, job


@pytest.fixture(scope="module")
def no_job_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs")
    fill(path)
    return path


def _job_sites(path, job) -> dict[str, dict]:
    with RunStore(path) as store:
        rows = store.evaluation_sites(job)
    return {r["site"]: json.loads(r["labels"])["finding"] for r in rows.to_dict("records")}


def test_the_exported_models_interval_is_the_evaluation_jobs_wherever_it_appears(store_dir):
    path, job = store_dir
    data = queries.run_data(path, "run-complete")
    exported = next(c for c in choices(data) if c.key == EXPORTED)
    assert exported.ci_method == BOOTSTRAP and job in exported.ci_source
    table = site_status(data, exported).set_index("site")
    scored = _job_sites(path, job)
    for site, result in scored.items():
        if result["auc"] is None:
            continue
        assert table.loc[site, "AUC"] == pytest.approx(result["auc"])
        assert (table.loc[site, "CI low"], table.loc[site, "CI high"]) == pytest.approx(
            (result["ci_lo"], result["ci_hi"])
        )
    # the Evaluations page's rows: the same figures, the method named beside them
    row = evaluations_data.jobs(path, "run-complete").iloc[0]
    forest = evaluations_data.forest(row, evaluations_data.site_rows(path, job, "test"), "finding")
    shown = evaluations_data.readable_forest(forest, POSITIVE).set_index("site")
    for site, result in scored.items():
        if result["auc"] is not None:
            assert shown.loc[site, "95 % CI"] == f"{result['ci_lo']:.3f}–{result['ci_hi']:.3f}"
            assert shown.loc[site, "CI method"] == BOOTSTRAP
    assert shown.filter(like="pooled", axis=0)["CI method"].tolist() == [BINNED_BOOTSTRAP]


def test_the_sites_page_shows_the_jobs_interval_and_names_its_method(monkeypatch, store_dir):
    path, job = store_dir
    at = open_page(monkeypatch, path, "sites", "run-complete")
    table = at.dataframe[0].value.set_index("site")
    column = f"95 % CI ({BOOTSTRAP})"
    for site, result in _job_sites(path, job).items():
        if result["auc"] is not None:
            assert table.loc[site, column] == f"{result['ci_lo']:.3f}–{result['ci_hi']:.3f}"
            assert table.loc[site, f"AUC ({POSITIVE})"] == f"{result['auc']:.3f}"
    assert f"95 % CIs of the site AUCs: {BOOTSTRAP} (evaluation job {job}" in texts(at)
    at.radio(key="sites_model").set_value("Last round (2 of 2)").run()
    assert f"95 % CI ({HANLEY_MCNEIL})" in at.dataframe[0].value.columns  # a round's method


def test_without_a_job_the_exported_interval_is_the_exports_own_named_hanley_mcneil(no_job_dir):
    data = queries.run_data(no_job_dir, "run-complete")
    exported = next(c for c in choices(data) if c.key == EXPORTED)
    assert exported.ci_method == HANLEY_MCNEIL
    table = site_status(data, exported).set_index("site")
    stored = data.evaluations.set_index("site")["labels"]
    assert table.loc["north", "CI low"] == pytest.approx(stored["north"][0]["auc_lo"])


def test_the_picker_and_the_overview_show_one_auc_for_the_exported_model(monkeypatch, store_dir):
    path, _ = store_dir
    runs = queries.runs(path).set_index("id")
    summary = runs.loc["run-complete", "summary"]
    at = open_page(monkeypatch, path, "overview", "run-complete")
    assert metrics(at)["Exported: pooled test AUC"] == f"{summary['exported_auc']:.3f}"
    assert runs.loc["run-complete", "final_auc"] == summary["exported_auc"]
    assert "AUC 0.610 (export)" in runs.loc["run-complete", "label"]  # and says what it is


def test_all_runs_shows_an_evaluation_jobs_auc_and_never_none(monkeypatch, store_dir):
    path, job = store_dir
    at = open_page(monkeypatch, path, "overview", "run-complete")
    table = at.dataframe[0].value
    assert not RAW & set(table.columns)
    cells = table.astype(str).to_numpy().ravel().tolist()
    assert not {"None", "nan", "NaN", "<NA>", ""} & set(cells)
    with RunStore(path) as store:
        pooled = store.run(job)["summary"]["auc"]["test"]["pooled"][0]
    row = table.set_index("id").loc[job]
    assert row["AUC"] == f"{pooled:.3f} (evaluation)"
    from app.tables import runs_table

    assert runs_table(queries.runs(path)).equals(table)  # the page shows runs_table


def test_evaluation_tables_read_as_numbers_with_named_columns(monkeypatch, store_dir):
    path, job = store_dir
    at = open_page(monkeypatch, path, "evaluations", job)
    table = at.dataframe[0].value
    assert not RAW & set(table.columns)
    assert f"AUC ({POSITIVE})" in table.columns and "CI method" in table.columns
    for cell in table["95 % CI"]:
        assert cell == "—" or len(cell.split("–")[0]) == 5, cell  # 0.750: three decimals
    assert "None" not in table.astype(str).to_numpy().ravel().tolist()


def _axis_titles(spec: dict) -> list[str]:
    """Every x/y title of a (layered) Vega-Lite spec."""
    found = []
    for key in ("x", "y"):
        title = spec.get("encoding", {}).get(key, {}).get("title")
        if title:
            found.append(title)
    for layer in spec.get("layer", []):
        found += _axis_titles(layer)
    return found


@pytest.mark.parametrize(
    ("page", "run"),
    [("overview", "run-complete"), ("sites", "run-complete"), ("compare", "run-complete")],
)
def test_every_auc_axis_names_the_positive_class(monkeypatch, store_dir, page, run):
    path, _ = store_dir
    at = open_page(monkeypatch, path, page, run)
    titles = [t for c in charts_of(at) for t in _axis_titles(json.loads(c.spec))]
    aucs = [t for t in titles if "AUC" in t]
    assert aucs, titles
    assert all(POSITIVE in t for t in aucs), aucs


@pytest.mark.parametrize("page", ["roc", "operating_point"])
def test_roc_and_calibration_axes_name_the_positive_class(monkeypatch, store_dir, page):
    path, _ = store_dir
    at = open_page(monkeypatch, path, page, "run-complete")
    titles = [t for c in charts_of(at) for t in _axis_titles(json.loads(c.spec))]
    assert any(POSITIVE in t for t in titles), titles


def test_the_evaluations_forest_axis_names_class_and_method(monkeypatch, store_dir):
    path, job = store_dir
    at = open_page(monkeypatch, path, "evaluations", job)
    (chart,) = charts_of(at)
    titles = _axis_titles(json.loads(chart.spec))
    assert any(POSITIVE in t and BOOTSTRAP in t for t in titles), titles


def _local_sites() -> dict:
    """Two sites' test splits with overlapping scores, and their scores: what local
    ``fed-auc evaluate --site`` holds in memory after scoring."""
    import numpy as np
    import torch

    from fed_auc.data.base import SiteData, Split

    out = {}
    for i, (name, n) in enumerate((("north", 90), ("south", 70))):
        rng = np.random.default_rng(i)
        y = (rng.random(n) < 0.35).astype(np.float32)
        s = np.clip(rng.normal(0.4 + 0.2 * y, 0.18), 0, 1)
        split = Split(torch.rand(n, 1, 8, 8), torch.from_numpy(y[:, None]))
        out[name] = (SiteData(name, split, split, split, ["finding"]), y, s)
    return out


def test_a_local_evaluation_shows_the_pooled_interval_it_printed(monkeypatch, tmp_path):
    """``fed-auc evaluate --site`` scores every image on one machine: its pooled AUC is the
    scores pooled, recorded and shown as printed (not the binned counts' approximation), and
    captioned as computed locally."""
    import numpy as np

    from fed_auc.evaluate.job import describe, record_local
    from fed_auc.exchange import EvaluationRequest
    from fed_auc.metrics.report import POOLED, label_result

    sites = _local_sites()
    results = {"label_names": ["finding"], "positive_class": [POSITIVE], "bootstrap": 200,
               "tta": "none", "sites": {}}  # fmt: skip
    for name, (_, y, s) in sites.items():
        results["sites"][name] = {"finding": label_result(y, s, 0.5, 200, 0)}
    y = np.concatenate([v[1] for v in sites.values()])
    s = np.concatenate([v[2] for v in sites.values()])
    results["sites"][POOLED] = {"finding": label_result(y, s, 0.5, 200, 0)}
    request = EvaluationRequest("fed-auc-model/1", {}, ["finding"], [0.5], "none", ["test"],
                                200, 0)  # fmt: skip
    card = {"run_id": "train-1", "label_names": ["finding"], "positive_class": [POSITIVE]}
    files = {"json": str(tmp_path / "out" / "evaluation.json")}
    run_id = record_local(tmp_path, results, request, card, tmp_path / "model",
                          {n: v[0] for n, v in sites.items()}, files)  # fmt: skip
    printed = results["sites"][POOLED]["finding"]
    line = next(x for x in describe(results) if x.startswith(POOLED))
    assert f"[{printed['ci_lo']:.3f}, {printed['ci_hi']:.3f}]" in line  # the console's

    (job,) = evaluations_data.jobs(tmp_path, run_id).to_dict("records")
    stored = job["pooled"]["finding"]
    assert (stored["auc"], stored["ci_lo"], stored["ci_hi"]) == (
        printed["auc"], printed["ci_lo"], printed["ci_hi"]
    )  # fmt: skip
    at = open_page(monkeypatch, tmp_path, "evaluations", run_id)
    table = at.dataframe[0].value.set_index("kind")
    assert table.loc["pooled", "95 % CI"] == f"{printed['ci_lo']:.3f}–{printed['ci_hi']:.3f}"
    assert table.loc["pooled", "CI method"] == BOOTSTRAP
    caption = " ".join(c.value for c in at.caption)
    assert "locally" in caption and "binned" not in caption, caption
