"""The run store: what is written is read back; a failed round leaves nothing behind."""

from __future__ import annotations

import sqlite3

import pytest

from fed_auc.store.records import RoundRecord, SiteRound
from fed_auc.store.run_store import STORE_FILE, RunStore


def _record(round_: int, metrics=None) -> RoundRecord:
    return RoundRecord(
        round=round_,
        stage=0,
        lr=0.1,
        global_auc=0.7,
        worst_site_auc=0.6,
        bytes_down=100,
        bytes_up=80,
        sites=[
            SiteRound(
                "a",
                "completed",
                steps=8,
                n=10,
                positives=[3],
                auc=0.6,
                auc_lo=0.5,
                auc_hi=0.7,
                update_norm=1.0,
                drift=0.1,
                cosine=0.9,
            ),
            SiteRound("b", "dropped", metrics=metrics if metrics is not None else {}),
        ],
        events=[("b", "error", "dropped: no answer in time")],
    )


def test_a_round_is_read_back_as_written(tmp_path):
    with RunStore(tmp_path) as store:
        run_id = store.create_run("codasca", {"rounds": 2}, git_rev="abc")
        store.record_sites(run_id, {"a": {"train": {"n": 10}}})
        store.record_round(run_id, _record(1))
        store.finish_run(run_id, "completed", {"global_auc": [0.5, 0.7]})

        run = store.run(run_id)
        assert run["status"] == "completed" and run["config"] == {"rounds": 2}
        assert run["summary"]["global_auc"] == [0.5, 0.7]
        rounds = store.rounds(run_id)
        assert rounds[["round", "global_auc", "bytes_up"]].values.tolist() == [[1, 0.7, 80]]
        sites = store.site_rounds(run_id).set_index("site")
        assert sites.loc["a", "status"] == "completed" and sites.loc["a", "positives"] == "[3]"
        assert sites.loc["b", "status"] == "dropped"
        assert store.events(run_id)["message"].tolist() == ["dropped: no answer in time"]
        assert len(store.sites(run_id)) == 1
    mode = sqlite3.connect(tmp_path / STORE_FILE).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_the_last_round_is_the_highest_recorded_of_that_run_only(tmp_path):
    with RunStore(tmp_path) as store:
        first = store.create_run("codasca", {"rounds": 12}, git_rev="abc")
        other = store.create_run("fedavg", {"rounds": 2}, git_rev="abc")
        assert store.last_round(first) is None  # nothing trained yet
        for round_ in (1, 2, 10):  # 10 after 2: a number, not text, is compared
            store.record_round(first, _record(round_))
        store.record_round(other, _record(11))
        assert store.last_round(first) == 10 and store.last_round(other) == 11


def test_a_round_that_fails_midway_leaves_no_partial_rows(tmp_path):
    with RunStore(tmp_path) as store:
        run_id = store.create_run("codasca", {})
        store.record_round(run_id, _record(1))
        with pytest.raises(TypeError):  # the second site's metrics cannot be written
            store.record_round(run_id, _record(2, metrics={"bad": object()}))
        assert store.rounds(run_id)["round"].tolist() == [1]
        assert set(store.site_rounds(run_id)["round"]) == {1}
        assert len(store.events(run_id)) == 1
        with pytest.raises(sqlite3.IntegrityError):  # a round is never written twice
            store.record_round(run_id, _record(1))
        assert len(store.site_rounds(run_id)) == 2


def test_unknown_run_is_a_clear_error(tmp_path):
    with RunStore(tmp_path) as store, pytest.raises(KeyError, match="no run 'nope'"):
        store.run("nope")


def test_a_comparison_replaces_the_last_of_the_same_runs_and_an_older_store_gains_the_table(
    tmp_path,
):
    with RunStore(tmp_path) as store:
        a = store.create_run("codasca", {})
        b = store.create_run("fedavg", {})
    conn = sqlite3.connect(tmp_path / STORE_FILE)  # a store written before the table
    conn.execute("DROP TABLE comparisons")
    conn.commit()
    conn.close()
    row = {"site": "east", "label": "finding", "positive_class": "finding", "auc_a": 0.8,
           "auc_b": 0.7, "difference": 0.1, "lo": 0.02, "hi": 0.18, "se": 0.04,
           "p_value": 0.01, "level": 0.95, "n": 50, "positives": 10,
           "method": "DeLong"}  # fmt: skip
    with RunStore(tmp_path) as store:
        assert store.comparisons(a, b).empty
        store.record_comparison(a, b, "test", [row, {**row, "site": "pooled"}])
        store.record_comparison(a, b, "test", [{**row, "difference": 0.05}])
        stored = store.comparisons(a, b)
        assert store.comparisons(b, a).empty  # A against B is not B against A
    assert stored["site"].tolist() == ["east"] and stored["difference"].tolist() == [0.05]
    first = stored.iloc[0]
    assert [first["run_a"], first["run_b"], first["split"]] == [a, b, "test"]
