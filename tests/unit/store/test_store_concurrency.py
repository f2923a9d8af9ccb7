"""The dashboard reads while a run writes: no partial round is ever seen, the writer never waits."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from fed_auc.store.records import RoundRecord, SiteRound
from fed_auc.store.run_store import STORE_FILE, RunStore, StoreError

SITES = [f"site{i}" for i in range(6)]


def round_record(r: int) -> RoundRecord:
    sites = [SiteRound(site=s, status="completed", auc=0.5 + r / 1000, n=10) for s in SITES]
    return RoundRecord(round=r, global_auc=0.6, sites=sites, events=[(SITES[0], "info", "x")])


def test_a_reader_never_sees_a_partial_round(tmp_path) -> None:
    store = RunStore(tmp_path)
    run_id = store.create_run("codasca", {"rounds": 60})
    seen: list[int] = []
    problems: list[str] = []
    done = threading.Event()

    def read() -> None:
        reader = RunStore(tmp_path)
        while not done.is_set():
            rows = reader.site_rounds(run_id)
            counts = rows.groupby("round")["site"].count()
            if not (counts == len(SITES)).all():
                problems.append(f"partial round: {counts.to_dict()}")
            seen.append(len(counts))
        reader.close()

    thread = threading.Thread(target=read)
    thread.start()
    for r in range(60):
        store.record_round(run_id, round_record(r))
    done.set()
    thread.join()
    store.close()
    assert not problems
    assert len(seen) > 1 and seen == sorted(seen)  # rounds only ever appear, whole


def test_an_open_read_transaction_does_not_block_the_writer(tmp_path) -> None:
    store = RunStore(tmp_path)
    run_id = store.create_run("codasca", {})
    store.record_round(run_id, round_record(0))
    reader = sqlite3.connect(f"file:{tmp_path / STORE_FILE}?mode=ro", uri=True)
    reader.execute("BEGIN")
    before = reader.execute("SELECT COUNT(*) FROM rounds").fetchone()[0]
    store._conn.execute("PRAGMA busy_timeout = 0")  # a blocked write would fail at once
    store.record_round(run_id, round_record(1))
    assert reader.execute("SELECT COUNT(*) FROM rounds").fetchone()[0] == before == 1  # snapshot
    reader.execute("COMMIT")
    assert reader.execute("SELECT COUNT(*) FROM rounds").fetchone()[0] == 2
    reader.close()
    store.close()


def test_a_store_file_that_is_not_sqlite_gets_a_clear_error_and_is_left_alone(tmp_path) -> None:
    path = tmp_path / STORE_FILE
    path.write_bytes(b"these are not the rounds you are looking for" * 100)
    with pytest.raises(StoreError, match=f"{path} is not a fed-auc run store"):
        RunStore(tmp_path)
    assert path.read_bytes().startswith(b"these are not")
