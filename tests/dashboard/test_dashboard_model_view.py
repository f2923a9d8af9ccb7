"""Which model and which sites each dashboard figure covers, on the store's rows (no
Streamlit): missing is not undefined, the exported model comes first, runs are told apart."""

from __future__ import annotations

import ast
import json

import pytest

from app import queries
from app.model_view import EXPORTED, LAST, choices, coverage, site_status
from app.tables import differing_settings
from fed_auc.store.run_store import RunStore
from tests.support.dashboard_store import EXPORTED_ROUND, THRESHOLD, fill
from tests.support.paths import ROOT


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs")
    fill(path)
    return path


def test_the_exported_model_comes_first_with_the_cards_threshold(runs_dir):
    data = queries.run_data(runs_dir, "run-complete")
    exported, last = choices(data)
    assert (exported.key, exported.round, exported.thresholds) == (
        EXPORTED,
        EXPORTED_ROUND,
        [THRESHOLD],
    )
    assert (last.key, last.round) == (LAST, 2)
    assert exported.title == "Exported model (round 1 of 2)"
    unfinished = queries.run_data(runs_dir, "run-live")
    assert [c.key for c in choices(unfinished)] == [LAST]  # nothing exported yet


def test_a_dropped_site_is_not_scored_not_undefined_and_left_out_of_the_stated_set(runs_dir):
    data = queries.run_data(runs_dir, "run-complete")
    table = site_status(data, choices(data)[1]).set_index("site")
    with RunStore(runs_dir) as store:
        rows = store.site_rounds("run-complete")
    south = rows[(rows["site"] == "south") & (rows["round"] == 1)].iloc[0]
    assert not table.loc["south", "scored"]
    assert table.loc["south", "note"] == (
        f"not scored since round 2 (dropped); last AUC {south['auc']:.3f} at round 1"
    )
    assert table.loc["east", "scored"] and "no positives" in table.loc["east", "note"]
    cover = coverage(site_status(data, choices(data)[1]))
    final = rows[(rows["round"] == 2) & rows["auc"].notna()]
    assert set(cover.scored) == {"east", "north", "west"}
    assert cover.missing == ["south"] and set(cover.defined) == {"north", "west"}
    assert cover.mean_auc == pytest.approx(final["auc"].mean())
    assert cover.worst_auc == pytest.approx(final["auc"].min())
    assert cover.sentence() == "3 of 4 sites scored, 1 with a one-class test split"


def test_a_site_the_export_could_not_reach_says_so(runs_dir, tmp_path):
    data = queries.run_data(runs_dir, "run-complete")
    data.evaluations = data.evaluations[data.evaluations["site"] != "west"]
    table = site_status(data, choices(data)[0]).set_index("site")
    assert not table.loc["west", "scored"]
    assert table.loc["west", "note"].startswith("the exported model was not scored here")
    assert "last AUC" in table.loc["west", "note"] and "at round 2" in table.loc["west", "note"]


def test_few_cases_are_marked_and_sites_rank_by_the_lower_bound(runs_dir):
    data = queries.run_data(runs_dir, "run-complete")
    table = site_status(data, choices(data)[0])
    lows = table["CI low"].dropna().tolist()
    assert lows == sorted(lows)
    east = table.set_index("site").loc["east"]
    assert east["positives"] == 0 and bool(east["few cases"])


def test_runs_are_labelled_so_that_they_can_be_told_apart(runs_dir):
    runs = queries.runs(runs_dir).set_index("id")
    assert runs["label"].is_unique
    label = runs.loc["run-complete", "label"]
    assert label.startswith(
        "codasca · synthetic · flower · 4 sites · AUC 0.610 (export) · completed"
    )
    assert runs.loc["run-other", "transport"] == "local"
    assert bool(runs.loc["run-complete", "synthetic"])


def test_compare_lists_only_the_settings_that_differ():
    table = differing_settings(
        {"a": {"lr": 0.1, "seed": 0, "sites": 4}, "b": {"lr": 0.05, "seed": 0}}
    )
    assert sorted(table.index) == ["lr", "sites"]
    assert table.loc["sites", "b"] == "–" and table.loc["lr", "a"] == "0.1"
    assert json.dumps(table.to_dict())  # plain values for st.dataframe


def test_the_app_reads_the_store_and_never_imports_training_code():
    """app/ imports from fed_auc only the store and the pure metric modules (no torch)."""
    allowed = {"fed_auc.store", "fed_auc.metrics.operating_point", "fed_auc.metrics.roc",
               "fed_auc.metrics.wording"}  # fmt: skip
    for path in (ROOT / "app").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] != "torch", (path, name)
                if name.startswith("fed_auc") and not name.startswith("fed_auc.store."):
                    assert name in allowed, (path, name)
