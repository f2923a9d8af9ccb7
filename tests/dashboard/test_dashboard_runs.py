"""Runs that are not plain training runs: a warm-up recorded as its own run (its rounds, its
sites, a link to the run it warm-started), and a nearly untrained model whose card's
threshold came out as 1.0 (the operating-point pages say what it means, never crash)."""

from __future__ import annotations

import numpy as np
import pytest

from app import queries
from fed_auc.metrics.operating_point import default_edges, score_bins
from fed_auc.store.records import RoundRecord, SiteRound
from fed_auc.store.run_store import RunStore
from tests.support.apptest import metrics, open_page, texts
from tests.support.dashboard_store import SITES, TEST_N, card, fill_warmup

WARM_ROUNDS, ROUNDS = 10, 60


@pytest.fixture(scope="module")
def warm_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs")
    warm, main = fill_warmup(path, WARM_ROUNDS, ROUNDS)
    return path, warm, main


def test_a_warm_up_run_shows_its_own_rounds_and_sites_and_links_its_main_run(
    monkeypatch, warm_store
):
    path, warm, main = warm_store
    runs = queries.runs(path).set_index("id")
    assert runs.loc[warm, "n_sites"] == len(SITES)  # no cards of its own: its rounds' sites
    assert f"warm-up of {main}" in runs.loc[warm, "label"]
    at = open_page(monkeypatch, path, "overview", warm)
    assert metrics(at)["Round"] == f"{WARM_ROUNDS} / {WARM_ROUNDS}"
    text = texts(at)
    assert f"round {WARM_ROUNDS} of {WARM_ROUNDS}" in text
    assert f"Warm-up of run {main}" in text
    assert "generated images" in text  # the main run's data cards: synthetic sites
    assert f"of {len(SITES)}" in metrics(at)["Last round: sites scored"]
    at.button(key="warmup_link").click().run()
    assert at.sidebar.selectbox(key="run_id").value == main
    assert f"Warm-started by run {warm}" in texts(at)
    assert metrics(at)["Round"] == f"2 / {ROUNDS}"


def test_the_dashboard_opens_on_the_main_run_not_its_newer_warm_up(monkeypatch, warm_store):
    path, warm, main = warm_store
    assert queries.runs(path)["id"].iloc[0] == warm  # newest
    at = open_page(monkeypatch, path, "overview")
    assert at.sidebar.selectbox(key="run_id").value == main
    at = open_page(monkeypatch, path, "sites", warm)
    assert not at.exception


@pytest.fixture(scope="module")
def untrained_store(tmp_path_factory):
    """A run whose exported model scores every image about 0.5 and whose card's Youden
    threshold came out as 1.0 (no threshold beat chance on validation)."""
    path = tmp_path_factory.mktemp("runs")
    rng = np.random.default_rng(7)
    exported = {}
    with RunStore(path) as store:
        run = store.create_run("codasca", {"rounds": 1}, run_id="run-untrained")
        store.record_sites(run, {s: card(s) for s in SITES})
        for round_ in (0, 1):
            rows = [SiteRound(s, "initial" if round_ == 0 else "completed", n_test=TEST_N,
                              test_positives=[20], auc=0.5, auc_lo=0.4, auc_hi=0.6)
                    for s in SITES]  # fmt: skip
            store.record_round(run, RoundRecord(round_, global_auc=0.5, sites=rows))
        for site in SITES:
            labels = (rng.random(TEST_N) < 0.3).astype(float)
            scores = 0.5 + rng.normal(0, 1e-4, TEST_N)
            bins = score_bins(labels, scores, default_edges([1.0]))
            exported[site] = [{"n": TEST_N, "positives": int(labels.sum()), "auc": 0.5,
                               "auc_lo": 0.4, "auc_hi": 0.6, "note": "", "threshold": 1.0,
                               "bins": bins.to_dict()}]  # fmt: skip
        store.record_model_evaluation(run, "exported", "test", exported)
        summary = {"selected_round": 1, "threshold": [1.0], "exported_auc": 0.5}
        store.finish_run(run, "completed", summary)
    return path


def test_a_card_threshold_of_one_is_explained_not_a_crash(monkeypatch, untrained_store):
    at = open_page(monkeypatch, untrained_store, "operating_point", "run-untrained")
    warning = " ".join(w.value for w in at.warning)
    assert "threshold is 1.000" in warning and "no threshold better than chance" in warning
    assert "figures below are at 0.999" in warning
    assert "At threshold 0.999" in [s.value for s in at.subheader]
    figures = at.dataframe[0].value.set_index("site")
    assert set(figures.index) == {*SITES, "pooled"}
    assert all(v.startswith("0.000 (") for v in figures["sensitivity (95 % CI)"])  # no one
    assert all(v.startswith("1.000 (") for v in figures["specificity (95 % CI)"])  # flagged
    at = open_page(monkeypatch, untrained_store, "roc", "run-untrained")
    assert at.select_slider(key="roc_threshold").value == pytest.approx(0.999)
    assert any("threshold is 1.000" in w.value for w in at.warning)
