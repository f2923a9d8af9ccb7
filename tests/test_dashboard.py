"""Every dashboard page, run with Streamlit's AppTest against a store the tests fill.

The numbers on a page must be the numbers in the store; empty, one-round, failed and live runs
render a message, never an exception.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from app import queries
from app.common import RUNS_DIR_ENV
from fed_auc.roc import operating_point
from fed_auc.store import RunStore
from tests.dashboard_store import SITES, fill, split_of

APP = str(Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py")
PAGES = ("overview", "sites", "heterogeneity", "participation", "compare", "roc")


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs")
    fill(path)
    return path


def open_page(monkeypatch, runs_dir, page: str, run_id: str | None = None) -> AppTest:
    monkeypatch.setenv(RUNS_DIR_ENV, str(runs_dir))
    at = AppTest.from_file(APP, default_timeout=60).run()
    if run_id is not None:
        at.sidebar.selectbox(key="run_id").select(run_id).run()
    if page != "overview":
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def texts(at: AppTest) -> str:
    parts = [*at.info, *at.error, *at.caption, *at.markdown, *at.subheader, *at.warning]
    return "\n".join(str(p.value) for p in parts)


def test_queries_open_the_store_read_only(store_dir):
    conn = queries.connect(store_dir)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        conn.execute("DELETE FROM runs")
    conn.close()
    assert queries.runs(store_dir)["id"].tolist() == [
        "run-live",
        "run-failed",
        "run-one",
        "run-complete",
        "run-other",
    ]
    with pytest.raises(FileNotFoundError, match="no run store"):
        queries.connect(store_dir / "nowhere")


def test_overview_shows_the_stored_round_metrics(monkeypatch, store_dir):
    at = open_page(monkeypatch, store_dir, "overview", "run-complete")
    with RunStore(store_dir) as store:
        last = store.rounds("run-complete").iloc[-1]
    shown = metrics(at)
    assert shown["Algorithm"] == "codasca" and shown["Status"] == "completed"
    assert shown["Round"] == "2 / 2"
    assert shown["Pooled test AUC"] == f"{last['global_auc']:.3f}"
    assert shown["Worst-site AUC"] == f"{last['worst_site_auc']:.3f}"
    assert len(at.dataframe[0].value) == 5


def test_sites_table_equals_the_store(monkeypatch, store_dir):
    at = open_page(monkeypatch, store_dir, "sites", "run-complete")
    with RunStore(store_dir) as store:
        stored = store.site_rounds("run-complete")
        worst = store.rounds("run-complete")["worst_site_auc"].iloc[-1]
    stored = stored[stored["round"] == 2].set_index("site")
    table = at.dataframe[0].value.set_index("site")
    assert sorted(table.index) == sorted(SITES)
    for column, source in (("AUC", "auc"), ("CI low", "auc_lo"), ("CI high", "auc_hi")):
        np.testing.assert_allclose(table[column], stored.loc[table.index, source])
    np.testing.assert_array_equal(table["n test"], stored.loc[table.index, "n_test"])
    for site in SITES:
        positives = int(split_of(site, 2)[0].sum())
        assert table.loc[site, "prevalence"] == pytest.approx(positives / 60)
    assert np.isnan(table.loc["east", "AUC"])
    assert "no positives" in table.loc["east", "note"]
    assert table.loc["south", "last round trained"] == 1  # dropped in round 2
    assert table.loc["north", "last round trained"] == 2
    shown = metrics(at)
    assert shown["Worst-site AUC"] == f"{worst:.3f}"
    assert shown["Sites with undefined AUC"] == "1"
    assert worst == pytest.approx(table["AUC"].min())


def test_heterogeneity_shows_data_cards_and_local_steps(monkeypatch, store_dir):
    at = open_page(monkeypatch, store_dir, "heterogeneity", "run-complete")
    cards = at.dataframe[0].value
    for i, site in enumerate(SITES):
        assert cards.loc[site, "prevalence"] == pytest.approx((10 + 5 * i) / 100)
        assert cards.loc[site, "train intensity mean"] == pytest.approx(0.3 + 0.05 * i)
    steps = at.dataframe[1].value
    # rounds 1 and 2: every completed site trained 4 + index steps (west rejected in 1,
    # south dropped in 2), so each site has one or two rounds of the same count
    assert steps.loc["east", "total steps"] == 8 and steps.loc["west", "rounds trained"] == 1
    assert steps.loc["south", "total steps"] == 6 and steps.loc["north", "mean"] == 5
    assert "Site × site similarity" in texts(at)

    other = open_page(monkeypatch, store_dir, "heterogeneity", "run-other")
    assert "No intensity statistics" in texts(other)


def test_participation_counts_statuses_and_lists_events(monkeypatch, store_dir):
    at = open_page(monkeypatch, store_dir, "participation", "run-complete")
    with RunStore(store_dir) as store:
        rows = store.site_rounds("run-complete")
        events = store.events("run-complete")
        rounds = store.rounds("run-complete")
    trained = rows[rows["round"] > 0]
    shown = metrics(at)
    for status in ("completed", "dropped", "rejected", "error"):
        assert shown[status.capitalize()] == str(int((trained["status"] == status).sum()))
    assert shown["Dropped"] == "1" and shown["Rejected"] == "1"
    assert at.dataframe[1].value["message"].tolist() == events["message"].tolist()
    down, up = rounds["bytes_down"].sum() / 1e6, rounds["bytes_up"].sum() / 1e6
    assert f"Traffic: {down:.1f} MB down, {up:.1f} MB up" in texts(at)
    assert "Trained depth" in texts(at)

    at.multiselect[0].set_value(["error"]).run()
    assert set(at.dataframe[1].value["level"]) == {"error"}


def test_compare_puts_runs_side_by_side_per_round_and_per_mb(monkeypatch, store_dir):
    at = open_page(monkeypatch, store_dir, "compare", "run-complete")
    at.multiselect(key="compare_runs").set_value(["run-complete", "run-other"]).run()
    assert not at.exception
    table = at.dataframe[0].value
    with RunStore(store_dir) as store:
        for run_id, algorithm in (("run-complete", "codasca"), ("run-other", "fedavg")):
            rounds = store.rounds(run_id)
            row = table.loc[f"{algorithm} · {run_id}"]
            total = (rounds["bytes_up"].sum() + rounds["bytes_down"].sum()) / 1e6
            assert row["total MB"] == pytest.approx(total)
            assert row["pooled test AUC"] == pytest.approx(rounds["global_auc"].iloc[-1])
    assert table["total MB"].iloc[1] == pytest.approx(2 * table["total MB"].iloc[0])


def test_roc_threshold_slider_reads_sensitivity_and_specificity(monkeypatch, store_dir):
    at = open_page(monkeypatch, store_dir, "roc", "run-complete")
    assert at.slider(key="roc_threshold").value == 0.5
    for threshold in (0.5, 0.3):
        at.slider(key="roc_threshold").set_value(threshold).run()
        table = at.dataframe[0].value.set_index("site")
        for site in ("north", "south", "west"):
            labels, scores = split_of(site, 2)
            true_sens = ((scores >= threshold) & (labels == 1)).sum() / labels.sum()
            true_spec = ((scores < threshold) & (labels == 0)).sum() / (labels == 0).sum()
            # the stored curve is exact here (≤ 101 points): interpolation between neighbours
            # stays within one step of the true operating point
            assert table.loc[site, "sensitivity"] == pytest.approx(true_sens, abs=0.1)
            assert table.loc[site, "specificity"] == pytest.approx(true_spec, abs=0.1)
        assert "ROC undefined" in table.loc["east", "note"]
    assert "At threshold 0.30" in texts(at)
    with RunStore(store_dir) as store:
        stored = store.site_rounds("run-complete")
    north = stored[(stored["round"] == 2) & (stored["site"] == "north")].iloc[0]
    expected = operating_point(json.loads(north["metrics"])["roc"][0], 0.3)
    assert table.loc["north", "sensitivity"] == pytest.approx(expected[0])


def visit_every_page(at: AppTest):
    """Switch through all pages of one AppTest session, yielding after each."""
    for page in PAGES:
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception, (page, [e.value for e in at.exception])
        yield page


def test_every_page_renders_a_one_round_run(monkeypatch, store_dir):
    at = open_page(monkeypatch, store_dir, "overview", "run-one")
    titles = [at.title[0].value for _ in visit_every_page(at)]
    assert titles == ["Overview", "Sites", "Heterogeneity", "Participation", "Compare runs", "ROC"]


@pytest.mark.parametrize(
    "run_id, message",
    [
        ("run-failed", "failed at round 0 of 5: round 1: no valid reply"),
        ("run-live", "is live: round 0 of 9"),
    ],
)
def test_every_page_shows_failed_and_live_runs(monkeypatch, store_dir, run_id, message):
    at = open_page(monkeypatch, store_dir, "overview", run_id)
    for page in visit_every_page(at):
        assert message in texts(at), page


def test_a_running_run_that_went_silent_is_flagged(monkeypatch, store_dir):
    monkeypatch.setattr("app.common.STALE_S", 0.0)
    at = open_page(monkeypatch, store_dir, "overview", "run-live")
    silent = r"nothing for \d+ min \(round 0 of 9\): its coordinator may have stopped"
    assert re.search(silent, texts(at))


@pytest.mark.parametrize("state", ["missing", "empty"])
def test_every_page_explains_an_empty_or_missing_store(monkeypatch, tmp_path, state):
    if state == "empty":
        RunStore(tmp_path).close()
    at = open_page(monkeypatch, tmp_path if state == "empty" else tmp_path / "nothing", "overview")
    expected = "has no runs yet" if state == "empty" else "No run store"
    for page in visit_every_page(at):
        assert expected in texts(at), page


def test_dashboard_without_streamlit_says_which_extra_instead_of_printing_a_url(
    monkeypatch, capsys
):
    import importlib.util

    from fed_auc import cli

    real = importlib.util.find_spec
    missing = lambda name, *a: None if name == "streamlit" else real(name, *a)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", missing)
    with pytest.raises(SystemExit, match=r"dashboard extra .*\[dashboard\]"):
        cli.dashboard("runs", 8501, "127.0.0.1")
    assert "http://" not in capsys.readouterr().err
