"""Every dashboard page, run with Streamlit's AppTest against a store the tests fill.

The numbers on a page must be the numbers in the store; empty, one-round, failed and live runs
render a message, never an exception.
"""

from __future__ import annotations

import json
import re
import sqlite3

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from app import queries
from app.pages import ROUND_PAGES
from fed_auc.metrics.roc import operating_point
from fed_auc.store.run_store import RunStore
from tests.support.apptest import metrics, open_page, texts
from tests.support.dashboard_store import EXPORTED_ROUND, SITES, THRESHOLD, fill, split_of


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs")
    fill(path)
    return path


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


def test_overview_headline_is_the_exported_model_and_the_last_round_comes_second(
    monkeypatch, store_dir
):
    at = open_page(monkeypatch, store_dir, "overview", "run-complete")
    with RunStore(store_dir) as store:
        rows = store.site_rounds("run-complete")
        last = store.rounds("run-complete").iloc[-1]
    shown = metrics(at)
    assert shown["Algorithm"] == "codasca" and shown["Status"] == "completed"
    assert shown["Round"] == "2 / 2"
    headings = [h.value for h in at.subheader]
    assert headings.index("Exported model (round 1 of 2)") < headings.index("Last round (2 of 2)")
    exported = rows[(rows["round"] == EXPORTED_ROUND) & rows["auc"].notna()]
    assert shown["Exported: worst-site AUC"] == f"{exported['auc'].min():.3f}"
    assert shown["Exported: sites scored"] == "4 of 4"
    # the last round: south dropped and was not scored; east has one class
    final = rows[(rows["round"] == 2) & rows["auc"].notna()]
    assert sorted(final["site"]) == ["north", "west"]
    assert shown["Last round: sites scored"] == "3 of 4"
    assert shown["Last round: worst-site AUC"] == f"{final['auc'].min():.3f}"
    assert shown["Last round: mean site AUC"] == f"{final['auc'].mean():.3f}"
    assert shown["Last round: pooled test AUC"] == f"{last['global_auc']:.3f}"
    south = rows[(rows["site"] == "south") & (rows["round"] == 1)].iloc[0]
    text = texts(at)
    assert (
        f"south not scored since round 2 (dropped); last AUC {south['auc']:.3f} at round 1" in text
    )
    assert "over 3 of 4 sites scored, 1 with a one-class test split" in text
    assert "not every site was scored (rounds 2)" in text
    runs = at.dataframe[0].value
    assert len(runs) == 5
    row = runs.set_index("id").loc["run-complete"]
    assert row["transport"] == "flower" and row["sites"] == "4" and row["data"] == "synthetic"
    assert row["AUC"] == "0.610 (export)"  # the run picker's figure, said what it is
    assert row["positive class"] == "finding present"
    assert runs.set_index("id").loc["run-live", "positive class"] == "label 1"  # no cards


def test_sites_says_who_was_not_scored_and_ranks_by_the_lower_bound(monkeypatch, store_dir):
    at = open_page(monkeypatch, store_dir, "sites", "run-complete")
    with RunStore(store_dir) as store:
        stored = store.site_rounds("run-complete")
    at.radio(key="sites_model").set_value("Last round (2 of 2)").run()
    table = at.dataframe[0].value.set_index("site")
    at2 = stored[stored["round"] == 2].set_index("site")
    scored = ["east", "north", "west"]
    auc, ci = "AUC (finding present)", "95 % CI (Hanley–McNeil)"
    for site in scored:
        row = at2.loc[site]
        assert table.loc[site, auc] == ("—" if np.isnan(row["auc"]) else f"{row['auc']:.3f}")
        if not np.isnan(row["auc"]):
            assert table.loc[site, ci] == f"{row['auc_lo']:.3f}–{row['auc_hi']:.3f}"
    for site in scored:
        positives = int(split_of(site, 2)[0].sum())
        assert table.loc[site, "positives"] == str(positives)
        assert table.loc[site, "negatives"] == str(60 - positives)
    assert "no positives" in table.loc["east", "note"]
    south_before = stored[(stored["round"] == 1) & (stored["site"] == "south")].iloc[0]
    assert table.loc["south", "note"] == (
        f"not scored since round 2 (dropped); last AUC {south_before['auc']:.3f} at round 1"
    )
    assert table.loc["south", auc] == "—" and table.loc["south", ci] == "—"
    lows = [float(c.split("–")[0]) for c in table[ci] if c != "—"]
    assert lows == sorted(lows)  # least certain site first
    assert table.loc["south", "last round trained"] == "1"  # dropped in round 2
    shown = metrics(at)
    assert shown["Sites scored"] == "3 of 4"
    assert shown["Worst-site AUC"] == f"{at2.loc[['north', 'west'], 'auc'].min():.3f}"
    assert shown["Sites with a one-class test split"] == "1"
    assert any("south: not scored since round 2" in str(w.value) for w in at.warning)

    at.radio(key="sites_model").set_value("Exported model (round 1 of 2)").run()
    exported = at.dataframe[0].value.set_index("site")
    at1 = stored[stored["round"] == EXPORTED_ROUND].set_index("site")
    assert [exported.loc[s, auc] for s in scored + ["south"]] == [
        "—" if np.isnan(a) else f"{a:.3f}" for a in at1.loc[scored + ["south"], "auc"]
    ]
    assert metrics(at)["Sites scored"] == "4 of 4"


def test_heterogeneity_shows_data_cards_and_local_steps(monkeypatch, store_dir):
    at = open_page(monkeypatch, store_dir, "heterogeneity", "run-complete")
    cards = at.dataframe[0].value
    for i, site in enumerate(SITES):
        assert cards.loc[site, "prevalence"] == f"{(10 + 5 * i) / 100:.3f}"
        assert cards.loc[site, "train mean"] == f"{0.3 + 0.05 * i:.3f}"
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
        for run_id in ("run-complete", "run-other"):
            rounds = store.rounds(run_id)
            row = table.loc[run_id]
            total = (rounds["bytes_up"].sum() + rounds["bytes_down"].sum()) / 1e6
            assert row["MB sent"] == f"{total:.1f}"
            assert row["last round: pooled AUC"] == f"{rounds['global_auc'].iloc[-1]:.3f}"
            assert row["positive class"] == "finding present"
    assert table.loc["run-complete", "exported AUC"] == "0.610"
    assert table.loc["run-other", "exported AUC"] == "—"  # it exported nothing
    assert float(table["MB sent"].iloc[1]) == pytest.approx(2 * float(table["MB sent"].iloc[0]))


def _paired_rows():
    """A comparison as ``fed-auc runs --compare`` records it: each site, then pooled; east has
    no positives."""
    rows = []
    for i, site in enumerate([*SITES, "pooled"]):
        auc_a, auc_b = 0.70 + 0.02 * i, 0.66 + 0.01 * i
        defined = site != "east"
        rows.append({
            "site": site, "label": "finding", "positive_class": "finding present",
            "auc_a": auc_a if defined else None, "auc_b": auc_b if defined else None,
            "difference": auc_a - auc_b if defined else None,
            "lo": auc_a - auc_b - 0.05 if defined else None,
            "hi": auc_a - auc_b + 0.05 if defined else None, "se": 0.025 if defined else None,
            "p_value": 0.2 if defined else None, "level": 0.95, "n": 60 + i,
            "positives": 12 + i if defined else 0, "method": "DeLong",
            "reason": "" if defined else "AUC undefined: no positives",
        })  # fmt: skip
    return rows


def test_compare_shows_a_recorded_paired_difference_else_the_command_that_records_it(
    monkeypatch, tmp_path
):
    fill(tmp_path)
    picked = ["run-complete", "run-other"]
    at = open_page(monkeypatch, tmp_path, "compare", "run-complete")
    at.multiselect(key="compare_runs").set_value(picked).run()
    assert "Paired difference on the same test images" in texts(at)
    command = f"`fed-auc runs --compare run-complete run-other --runs-dir {tmp_path}`"
    assert command in "\n".join(str(i.value) for i in at.info)

    rows = _paired_rows()
    with RunStore(tmp_path) as store:
        store.record_comparison("run-complete", "run-other", "test", rows)
    at = open_page(monkeypatch, tmp_path, "compare", "run-complete")
    at.multiselect(key="compare_runs").set_value(picked).run()
    assert not at.exception and command not in texts(at)
    (table,) = [d.value for d in at.dataframe if "A − B" in d.value.columns]
    assert list(table.index) == sorted(SITES) + ["pooled"]
    for row in rows:
        shown = table.loc[row["site"]]
        assert shown["test images"] == str(row["n"]) and shown["positives"] == str(row["positives"])
        if row["auc_a"] is None:
            assert shown["AUC A"] == shown["A − B"] == "—"
            assert shown["note"] == "AUC undefined: no positives"
            continue
        assert shown["AUC A"] == f"{row['auc_a']:.3f}" and shown["AUC B"] == f"{row['auc_b']:.3f}"
        assert shown["A − B"] == f"{row['difference']:+.3f}"
        assert shown["95 % CI (DeLong, paired)"] == f"{row['lo']:+.3f} to {row['hi']:+.3f}"
    caption = (
        "A = codasca run run-complete, B = fedavg run run-other: exported models on the test "
        "split of 4 site(s) (east, north, south, west), positive class finding present"
    )
    assert caption in texts(at)


def test_roc_last_round_view_starts_at_the_cards_threshold(monkeypatch, store_dir):
    at = open_page(monkeypatch, store_dir, "roc", "run-complete")
    at.radio(key="roc_model").set_value("Last round (2 of 2)").run()
    assert at.slider(key="roc_round_threshold").value == round(THRESHOLD, 2)
    for threshold in (0.5, 0.3):
        at.slider(key="roc_round_threshold").set_value(threshold).run()
        table = at.dataframe[0].value.set_index("site")
        for site in ("north", "west"):
            labels, scores = split_of(site, 2)
            true_sens = ((scores >= threshold) & (labels == 1)).sum() / labels.sum()
            true_spec = ((scores < threshold) & (labels == 0)).sum() / (labels == 0).sum()
            # the stored curve is exact here (≤ 101 points): interpolation between neighbours
            # stays within one step of the true operating point
            assert table.loc[site, "sensitivity"] == pytest.approx(true_sens, abs=0.1)
            assert table.loc[site, "specificity"] == pytest.approx(true_spec, abs=0.1)
        assert "ROC undefined" in table.loc["east", "note"]
        assert "south" not in table.index  # not scored in round 2
    assert "At threshold 0.30" in texts(at)
    with RunStore(store_dir) as store:
        stored = store.site_rounds("run-complete")
    north = stored[(stored["round"] == 2) & (stored["site"] == "north")].iloc[0]
    expected = operating_point(json.loads(north["metrics"])["roc"][0], 0.3)
    assert table.loc["north", "sensitivity"] == pytest.approx(expected[0])


def visit_every_page(at: AppTest):
    """Switch through all pages of one AppTest session, yielding after each."""
    for page in ROUND_PAGES:
        at.switch_page(page.file).run()
        assert not at.exception, (page.key, [e.value for e in at.exception])
        yield page.key


def test_every_page_renders_a_one_round_run(monkeypatch, store_dir):
    at = open_page(monkeypatch, store_dir, "overview", "run-one")
    titles = [at.title[0].value for _ in visit_every_page(at)]
    assert titles == [
        "Overview", "Sites", "Heterogeneity", "Participation", "Compare runs", "ROC",
        "Operating point",
    ]  # fmt: skip


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


@pytest.mark.parametrize("state", ["missing", "empty", "not a database"])
def test_every_page_explains_an_empty_missing_or_unreadable_store(monkeypatch, tmp_path, state):
    """An unreadable store file is a message naming it and what to do, never a traceback (with
    the install's paths) in the page."""
    if state == "empty":
        RunStore(tmp_path).close()
    if state == "not a database":
        (tmp_path / "fed_auc.sqlite").write_bytes(b"these are not the runs you are looking for")
    where = tmp_path / "nothing" if state == "missing" else tmp_path
    at = open_page(monkeypatch, where, "overview")
    expected = {
        "missing": "No run store",
        "empty": "has no runs yet",
        "not a database": f"{tmp_path / 'fed_auc.sqlite'} is not a fed-auc run store",
    }[state]
    for page in visit_every_page(at):
        assert expected in texts(at), page
        assert not at.exception, page


def test_dashboard_without_streamlit_says_which_extra_instead_of_printing_a_url(
    monkeypatch, capsys
):
    import importlib.util

    from fed_auc.cli.dashboard_auth import Settings
    from fed_auc.cli.dashboard_process import dashboard

    real = importlib.util.find_spec
    missing = lambda name, *a: None if name == "streamlit" else real(name, *a)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", missing)
    with pytest.raises(SystemExit, match=r"dashboard extra .*\[dashboard\]"):
        dashboard(Settings())
    assert "http://" not in capsys.readouterr().err


def test_an_export_from_the_warmup_and_an_early_stop_are_named(monkeypatch, tmp_path):
    """A run whose AUC phase never beat its warm-up exported the warm-up's model: the page
    names that stage, and why the run stopped before its planned rounds."""
    fill(tmp_path)
    selected = [{"stage": "warm-up", "run_id": "run-warm", "algorithm": "fedavg", "loss": "ce",
                 "round": 9, "val_auc": 0.9}]  # fmt: skip
    reason = ("pooled validation AUC has not improved for 2 evaluations on 0.9000 at warm-up "
              "round 9 (--early-stop 2)")  # fmt: skip
    summary = {"selected_round": 9, "selected": selected, "threshold": [THRESHOLD],
               "stopped": {"round": 2, "reason": reason}, "exported_auc": 0.61}  # fmt: skip
    with RunStore(tmp_path) as store:
        store.finish_run("run-complete", "completed", summary)
    at = open_page(monkeypatch, tmp_path, "overview", "run-complete")
    assert "Exported model (warm-up round 9 (fedavg + ce))" in [h.value for h in at.subheader]
    assert f"Stopped early after round 2: {reason}" in [c.value for c in at.caption]
