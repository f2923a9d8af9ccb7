"""Read-only access to the run store, as pandas tables the pages draw.

The dashboard never writes: the store is opened with SQLite's ``mode=ro`` URI, so a running
federation (WAL mode) keeps writing while the pages read. No Streamlit here, so this layer is
tested on its own; ``app/common.py`` caches it.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from fed_auc.store import STORE_FILE

MB = 1e6
_JSON_COLUMNS = ("trained_groups", "positives", "test_positives", "metrics")


def store_path(runs_dir: str | Path) -> Path:
    return Path(runs_dir) / STORE_FILE


def store_version(runs_dir: str | Path) -> float:
    """Changes whenever a round is written (the WAL file grows): the cache key of every query."""
    path = store_path(runs_dir)
    parts = [path, path.with_name(path.name + "-wal")]
    return sum(p.stat().st_mtime_ns + p.stat().st_size for p in parts if p.exists())


def connect(runs_dir: str | Path) -> sqlite3.Connection:
    """A read-only connection; FileNotFoundError naming the file when there is no store."""
    path = store_path(runs_dir)
    if not path.exists():
        raise FileNotFoundError(f"no run store at {path}")
    return sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True, timeout=10)


def _frame(runs_dir: str | Path, sql: str, params: tuple[Any, ...] = ()) -> pd.DataFrame:
    conn = connect(runs_dir)
    try:
        return pd.read_sql_query(sql, conn, params=params)
    finally:
        conn.close()


def _loads(text: Any) -> Any:
    return json.loads(text) if isinstance(text, str) else None


def runs(runs_dir: str | Path) -> pd.DataFrame:
    """Every run, newest first, with the number of rounds recorded and a label for pickers."""
    frame = _frame(
        runs_dir,
        "SELECT runs.*, (SELECT MAX(round) FROM rounds WHERE run_id = runs.id) AS last_round"
        " FROM runs ORDER BY started_at DESC",
    )
    frame["config"] = frame["config"].map(_loads)
    frame["summary"] = frame["summary"].map(_loads)
    started = pd.to_datetime(frame["started_at"], unit="s").dt.strftime("%Y-%m-%d %H:%M")
    frame["label"] = frame["algorithm"] + " · " + frame["status"] + " · " + started
    frame["label"] += " · " + frame["id"]
    return frame


@dataclass
class RunData:
    """Everything the pages show about one run."""

    run: dict[str, Any]
    rounds: pd.DataFrame
    site_rounds: pd.DataFrame
    sites: pd.DataFrame
    events: pd.DataFrame

    @property
    def planned_rounds(self) -> int | None:
        value = (self.run["config"] or {}).get("rounds")
        return int(value) if value is not None else None


def run_data(runs_dir: str | Path, run_id: str) -> RunData:
    """One run's rows, JSON columns decoded; KeyError naming the run if it is not there."""
    table = runs(runs_dir)
    match = table[table["id"] == run_id]
    if match.empty:
        raise KeyError(f"no run {run_id!r} in {store_path(runs_dir)}")
    rounds = _frame(runs_dir, "SELECT * FROM rounds WHERE run_id = ? ORDER BY round", (run_id,))
    rounds["metrics"] = rounds["metrics"].map(_loads)
    rounds["mb"] = (rounds["bytes_up"].fillna(0) + rounds["bytes_down"].fillna(0)) / MB
    rounds["cumulative_mb"] = rounds["mb"].cumsum()
    site_rounds = _frame(
        runs_dir, "SELECT * FROM site_rounds WHERE run_id = ? ORDER BY round, site", (run_id,)
    )
    for column in _JSON_COLUMNS:
        site_rounds[column] = site_rounds[column].map(_loads)
    sites = _frame(runs_dir, "SELECT * FROM sites WHERE run_id = ? ORDER BY site", (run_id,))
    sites["summary"] = sites["summary"].map(_loads)
    events = _frame(runs_dir, "SELECT * FROM events WHERE run_id = ? ORDER BY id", (run_id,))
    return RunData(match.iloc[0].to_dict(), rounds, site_rounds, sites, events)
