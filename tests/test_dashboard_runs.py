"""Runs that are not plain training runs: a warm-up recorded as its own run (its rounds, its
sites, a link to the run it warm-started), and a nearly untrained model whose card's
threshold came out as 1.0 (the operating-point pages say what it means, never crash)."""

from __future__ import annotations

import pytest

from app import queries
from tests.dashboard_store import SITES, fill_warmup
from tests.test_dashboard import metrics, open_page, texts

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
