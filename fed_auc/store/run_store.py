"""The SQLite run store: one file per runs directory, WAL mode, one transaction per round.

The dashboard reads only this file. A round is written whole or not at all, so a crash
never leaves a half-written round.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from fed_auc.store.comparisons import COMPARISON_SCHEMA, ComparisonTables
from fed_auc.store.evaluations import EVALUATION_SCHEMA, EvaluationTables
from fed_auc.store.predictions import PREDICTION_SCHEMA, PredictionTables
from fed_auc.store.records import RoundRecord, encode_row
from fed_auc.store.schema import ADDED_COLUMNS, RUN_SCHEMA

STORE_FILE = "fed_auc.sqlite"
SCHEMA = RUN_SCHEMA + EVALUATION_SCHEMA + COMPARISON_SCHEMA + PREDICTION_SCHEMA  # every table


class StoreError(RuntimeError):
    """The store file cannot be used (not SQLite, or not a fed-auc store)."""


class RunStore(EvaluationTables, ComparisonTables, PredictionTables):
    """Reads and writes the runs of one runs directory."""

    def __init__(self, runs_dir: str | Path) -> None:
        self.runs_dir = Path(runs_dir)
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.runs_dir / STORE_FILE
        self._conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(SCHEMA)
            self._add_columns()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise StoreError(
                f"{self.path} is not a fed-auc run store (SQLite said: {exc}); move it aside "
                "or choose another --runs-dir"
            ) from None

    def close(self) -> None:
        self._conn.close()

    def _add_columns(self) -> None:
        """Bring a store written by an older fed-auc up to this schema (ADDED_COLUMNS)."""
        for table, columns in ADDED_COLUMNS.items():
            present = {row[1] for row in self._conn.execute(f"PRAGMA table_info({table})")}
            for name, kind in columns:
                if name not in present:
                    self._conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ------------------------------------------------------------------------
    def create_run(
        self,
        algorithm: str,
        config: Mapping[str, Any],
        git_rev: str | None = None,
        run_id: str | None = None,
    ) -> str:
        run_id = run_id or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        run_dir = self.runs_dir / run_id
        with self._transaction():
            self._conn.execute(
                "INSERT INTO runs (id, algorithm, status, config, started_at, git_rev, run_dir)"
                " VALUES (?, ?, 'running', ?, ?, ?, ?)",
                (run_id, algorithm, json.dumps(config), time.time(), git_rev, str(run_dir)),
            )
        return run_id

    def update_config(self, run_id: str, config: Mapping[str, Any]) -> None:
        """Record the run's config once settled (a Flower run fills data-dependent defaults
        after its nodes register)."""
        with self._transaction():
            self._conn.execute(
                "UPDATE runs SET config = ? WHERE id = ?", (json.dumps(config), run_id)
            )

    def record_sites(self, run_id: str, summaries: Mapping[str, Mapping[str, Any]]) -> None:
        with self._transaction():
            self._conn.executemany(
                "INSERT OR REPLACE INTO sites (run_id, site, summary) VALUES (?, ?, ?)",
                [(run_id, site, json.dumps(s)) for site, s in summaries.items()],
            )

    def record_round(self, run_id: str, record: RoundRecord) -> None:
        """Write the round, its site rows and its events in one transaction."""
        row = {k: v for k, v in asdict(record).items() if k not in ("sites", "events")}
        row.update(run_id=run_id, finished_at=time.time())
        with self._transaction():
            self._insert("rounds", encode_row(row))
            for site in record.sites:
                self._insert(
                    "site_rounds",
                    encode_row({"run_id": run_id, "round": record.round, **asdict(site)}),
                )
            for site, level, message in record.events:
                self._event(run_id, record.round, site, level, message)

    def add_event(
        self,
        run_id: str,
        message: str,
        level: str = "info",
        site: str | None = None,
        round_: int | None = None,
    ) -> None:
        with self._transaction():
            self._event(run_id, round_, site, level, message)

    def finish_run(self, run_id: str, status: str, summary: Mapping[str, Any]) -> None:
        with self._transaction():
            self._conn.execute(
                "UPDATE runs SET status = ?, ended_at = ?, summary = ? WHERE id = ?",
                (status, time.time(), json.dumps(summary), run_id),
            )

    @contextmanager
    def failure_recorded(self, run_id: str) -> Iterator[None]:
        """From here on a failure or a stop (Ctrl-C, SIGTERM) marks the run failed, with why
        (``fail_run``): how every run, training or evaluation, records its failure."""
        try:
            yield
        except BaseException as exc:
            self.fail_run(run_id, exc)
            raise

    def fail_run(self, run_id: str, exc: BaseException) -> None:
        """Mark the run failed with why (rounds already recorded stay) and close the store:
        the one failure path of every run, training or evaluation."""
        if isinstance(exc, KeyboardInterrupt):  # Ctrl-C, or SIGTERM where the CLI maps it so
            reason = "stopped by the operator (Ctrl-C or SIGTERM)"
            self.add_event(run_id, f"run {reason}; it can be resumed", level="error")
        else:
            reason = str(exc)
            self.add_event(run_id, f"run failed: {type(exc).__name__}: {exc}", level="error")
        self.finish_run(run_id, "failed", {"error": reason})
        self.close()

    def abandon_run(self, run_id: str, reason: str, message: str | None = None) -> None:
        """A run whose coordinator is gone: ``message`` (default: ``reason``) in its events,
        and the run failed for ``reason`` if it still runs (the process that ran it may have
        recorded its own failure first)."""
        self.add_event(run_id, message or reason, level="error")
        if self.run(run_id)["status"] == "running":
            self.finish_run(run_id, "failed", {"error": reason})

    def reopen_run(self, run_id: str, message: str) -> None:
        """Mark a run running again (``--resume``), with an event saying from where."""
        with self._transaction():
            self._conn.execute(
                "UPDATE runs SET status = 'running', ended_at = NULL WHERE id = ?", (run_id,)
            )
            self._event(run_id, None, None, "info", message)

    # -- reading ------------------------------------------------------------------------
    def runs(self) -> pd.DataFrame:
        return self._frame("SELECT * FROM runs ORDER BY started_at")

    def run(self, run_id: str) -> dict[str, Any]:
        row = self._conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(f"no run {run_id!r} in {self.path}")
        out = dict(row)
        out["config"] = json.loads(out["config"])
        out["summary"] = json.loads(out["summary"]) if out["summary"] else None
        return out

    def rounds(self, run_id: str) -> pd.DataFrame:
        return self._frame("SELECT * FROM rounds WHERE run_id = ? ORDER BY round", (run_id,))

    def last_round(self, run_id: str) -> int | None:
        """The last round recorded for ``run_id`` (rounds count from 1); None before round 1."""
        row = self._conn.execute("SELECT MAX(round) FROM rounds WHERE run_id = ?", (run_id,))
        last = row.fetchone()[0]
        return None if last is None else int(last)

    def site_rounds(self, run_id: str) -> pd.DataFrame:
        return self._frame(
            "SELECT * FROM site_rounds WHERE run_id = ? ORDER BY round, site", (run_id,)
        )

    def sites(self, run_id: str) -> pd.DataFrame:
        return self._frame("SELECT * FROM sites WHERE run_id = ? ORDER BY site", (run_id,))

    def events(self, run_id: str) -> pd.DataFrame:
        return self._frame("SELECT * FROM events WHERE run_id = ? ORDER BY id", (run_id,))

    # -- internals ----------------------------------------------------------------------
    def _transaction(self) -> _Transaction:
        return _Transaction(self._conn)

    def _insert(self, table: str, row: Mapping[str, Any]) -> None:
        columns = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        self._conn.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", tuple(row.values()))

    def _event(
        self, run_id: str, round_: int | None, site: str | None, level: str, message: str
    ) -> None:
        self._conn.execute(
            "INSERT INTO events (time, run_id, round, site, level, message)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (time.time(), run_id, round_, site, level, message),
        )

    def _frame(self, sql: str, params: Iterable[Any] = ()) -> pd.DataFrame:
        return pd.read_sql_query(sql, self._conn, params=tuple(params))


class _Transaction:
    """BEGIN IMMEDIATE … COMMIT, rolled back on any exception."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._conn.execute("ROLLBACK" if exc_type else "COMMIT")


def run_to_resume(runs_dir: str | Path, run_id: str, command: str) -> dict[str, Any]:
    """The recorded run ``run_id`` that ``command`` (``fed-auc simulate``, ``fed-auc
    coordinator``) is to continue. Never creates a folder or a store: a mistyped id or runs
    dir is an error naming the runs that can be resumed there."""
    path = Path(runs_dir) / STORE_FILE
    if not path.is_file():
        raise ValueError(
            f"no run store at {path}, so no run {run_id!r} to resume; give the --runs-dir "
            f"the run was started with (`{command} --resume RUN_ID --runs-dir DIR`)"
        )
    with RunStore(runs_dir) as store:
        try:
            run = store.run(run_id)
        except KeyError:
            runs = store.runs()
            open_runs = runs[(runs["status"] != "completed") & (runs["algorithm"] != "evaluate")]
            ids = list(open_runs["id"])[::-1]  # latest first
            held = (
                "the runs there that can be resumed, latest first: " + ", ".join(ids[:5])
                if ids
                else "it holds no run that can be resumed"
            )
            raise ValueError(f"no run {run_id!r} in {path}; {held}") from None
    if run["status"] == "completed":
        raise ValueError(f"run {run_id!r} already completed: nothing to resume")
    return run


def git_revision() -> str | None:
    """The code's git revision, recorded with each run (None outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
