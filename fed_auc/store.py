"""The SQLite run store: one file per runs directory, WAL mode, one transaction per round.

The dashboard reads only this file. A round is written whole or not at all, so a crash
never leaves a half-written round.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

STORE_FILE = "fed_auc.sqlite"

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    algorithm TEXT NOT NULL,
    status TEXT NOT NULL,             -- running / completed / failed
    config TEXT NOT NULL,             -- JSON: everything needed to reproduce the run
    started_at REAL NOT NULL,
    ended_at REAL,
    git_rev TEXT,
    run_dir TEXT,
    summary TEXT                      -- JSON, written when the run ends
);
CREATE TABLE IF NOT EXISTS rounds (
    run_id TEXT NOT NULL REFERENCES runs(id),
    round INTEGER NOT NULL,           -- 0 = the initial model, before any training
    stage INTEGER,
    lr REAL,
    global_auc REAL,                  -- pooled test AUC of the global model over all sites
    global_val_auc REAL,
    worst_site_auc REAL,
    mean_site_auc REAL,
    metrics TEXT,                     -- JSON: per-label AUCs and anything else
    duration_s REAL,
    bytes_down INTEGER,
    bytes_up INTEGER,
    finished_at REAL,
    PRIMARY KEY (run_id, round)
);
CREATE TABLE IF NOT EXISTS site_rounds (
    run_id TEXT NOT NULL REFERENCES runs(id),
    round INTEGER NOT NULL,
    site TEXT NOT NULL,
    status TEXT NOT NULL,             -- selected / completed / dropped / rejected / error / idle
    steps INTEGER,
    trained_groups TEXT,              -- JSON list of layer-group names
    n INTEGER,                        -- training examples
    positives TEXT,                   -- JSON list, per label
    auc REAL,                         -- test AUC of the global model at this site
    auc_lo REAL,
    auc_hi REAL,
    val_auc REAL,
    n_test INTEGER,
    test_positives TEXT,              -- JSON list, per label
    personal_auc REAL,
    personal_auc_lo REAL,
    personal_auc_hi REAL,
    update_norm REAL,                 -- ‖Δw_k‖
    drift REAL,                       -- ‖Δw_k − mean Δw‖
    cosine REAL,                      -- cos(Δw_k, mean Δw)
    cv_drift REAL,                    -- ‖Δc_k‖ (control-variate change), where the backend has one
    train_loss REAL,
    duration_s REAL,
    bytes_down INTEGER,
    bytes_up INTEGER,
    metrics TEXT,                     -- JSON
    dp_epsilon REAL,                  -- DP-SGD: the site's ε spent so far (its accountant)
    dp_delta REAL,                    -- ... at this δ
    PRIMARY KEY (run_id, round, site)
);
CREATE TABLE IF NOT EXISTS sites (
    run_id TEXT NOT NULL REFERENCES runs(id),
    site TEXT NOT NULL,
    summary TEXT NOT NULL,            -- JSON data-card summary: counts, prevalence, intensity
    PRIMARY KEY (run_id, site)
);
CREATE TABLE IF NOT EXISTS model_evaluations (
    run_id TEXT NOT NULL REFERENCES runs(id),
    model TEXT NOT NULL,              -- "exported": the model the run exported; else a job name
    split TEXT NOT NULL,
    site TEXT NOT NULL,
    labels TEXT NOT NULL,             -- JSON list per label: n, positives, threshold, AUC + CI,
                                      -- score bins (fed_auc.operating_point.ScoreBins.to_dict)
    recorded_at REAL NOT NULL,
    PRIMARY KEY (run_id, model, split, site)
);
CREATE TABLE IF NOT EXISTS evaluations (
    run_id TEXT NOT NULL REFERENCES runs(id), -- the run that scored it: an evaluation-only run,
                                      -- or a hold-out training run scoring its export
    split TEXT NOT NULL,
    model TEXT NOT NULL,              -- the model scored (path of its model.pt or folder)
    model_run_id TEXT,                -- the run that trained it (its model card's run_id)
    transport TEXT NOT NULL,          -- local (in-process) or flower
    label_names TEXT NOT NULL,        -- JSON list
    held_out TEXT NOT NULL,           -- JSON list: sites the model was not trained on
    pooled TEXT,                      -- JSON per label: AUC from binned counts, CI, error bound
    failures TEXT NOT NULL,           -- JSON: site → why it did not report
    recorded_at REAL NOT NULL,
    PRIMARY KEY (run_id, split)
);
CREATE TABLE IF NOT EXISTS evaluation_sites (
    run_id TEXT NOT NULL REFERENCES runs(id),
    split TEXT NOT NULL,
    site TEXT NOT NULL,
    held_out INTEGER NOT NULL,        -- 1: the model was not trained on this site
    status TEXT NOT NULL,             -- reported / error / dropped
    reason TEXT,                      -- why it did not report
    labels TEXT,                      -- JSON per label: what fed_auc.evaluate.label_result gives
    PRIMARY KEY (run_id, split, site)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    run_id TEXT NOT NULL,
    round INTEGER,
    site TEXT,
    level TEXT NOT NULL,              -- info / warning / error
    message TEXT NOT NULL
);
"""

# Columns added since a table was first shipped: an older store gets them when opened, so it
# stays readable and writable (rows written before read NULL there).
ADDED_COLUMNS: dict[str, list[tuple[str, str]]] = {
    "site_rounds": [("dp_epsilon", "REAL"), ("dp_delta", "REAL")],
}


@dataclass
class SiteRound:
    """One site's row for one round."""

    site: str
    status: str
    steps: int | None = None
    trained_groups: list[str] | None = None
    n: int | None = None
    positives: list[int] | None = None
    auc: float | None = None
    auc_lo: float | None = None
    auc_hi: float | None = None
    val_auc: float | None = None
    n_test: int | None = None
    test_positives: list[int] | None = None
    personal_auc: float | None = None
    personal_auc_lo: float | None = None
    personal_auc_hi: float | None = None
    update_norm: float | None = None
    drift: float | None = None
    cosine: float | None = None
    cv_drift: float | None = None
    train_loss: float | None = None
    duration_s: float | None = None
    bytes_down: int | None = None
    bytes_up: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    dp_epsilon: float | None = None  # DP-SGD: ε this site has spent up to this round
    dp_delta: float | None = None


@dataclass
class RoundRecord:
    """A whole round: the global row, every site's row and the round's events."""

    round: int
    stage: int | None = None
    lr: float | None = None
    global_auc: float | None = None
    global_val_auc: float | None = None
    worst_site_auc: float | None = None
    mean_site_auc: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    duration_s: float | None = None
    bytes_down: int = 0
    bytes_up: int = 0
    sites: list[SiteRound] = field(default_factory=list)
    events: list[tuple[str | None, str, str]] = field(default_factory=list)  # site, level, msg


_JSON_COLUMNS = {"trained_groups", "positives", "test_positives", "metrics"}


def _encode(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: json.dumps(v) if k in _JSON_COLUMNS and v is not None else v for k, v in row.items()}


class StoreError(RuntimeError):
    """The store file cannot be used (not SQLite, or not a fed-auc store)."""


class RunStore:
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
            self._insert("rounds", _encode(row))
            for site in record.sites:
                self._insert(
                    "site_rounds",
                    _encode({"run_id": run_id, "round": record.round, **asdict(site)}),
                )
            for site, level, message in record.events:
                self._event(run_id, record.round, site, level, message)

    def record_model_evaluation(
        self, run_id: str, model: str, split: str, sites: Mapping[str, list[dict[str, Any]]]
    ) -> None:
        """One model scored on one split of each site: per label its counts, threshold, AUC
        and score bins (never per-image scores). Replaces an earlier record of the same."""
        now = time.time()
        with self._transaction():
            self._conn.executemany(
                "INSERT OR REPLACE INTO model_evaluations"
                " (run_id, model, split, site, labels, recorded_at) VALUES (?, ?, ?, ?, ?, ?)",
                [(run_id, model, split, site, json.dumps(v), now) for site, v in sites.items()],
            )

    def record_evaluation(self, run_id: str, split: str, result: Mapping[str, Any]) -> None:
        """A federated evaluation of one split (``fed_auc.evaluation_job.combine``): the job's
        row and one row per site, failures included, in one transaction."""
        held = set(result["held_out"])
        sites = {s: r for s, r in result["sites"].items() if s != "pooled"}
        pooled = result["sites"].get("pooled")
        row = (
            run_id, split, result["model"], result.get("model_run_id"), result["transport"],
            json.dumps(result["label_names"]), json.dumps(sorted(held)),
            None if pooled is None else json.dumps(pooled), json.dumps(result["failures"]),
            time.time(),
        )  # fmt: skip
        site_rows = [
            (run_id, split, site, int(site in held), "reported", None, json.dumps(labels))
            for site, labels in sites.items()
        ]
        site_rows += [
            (run_id, split, site, int(site in held), reason.split(":")[0], reason, None)
            for site, reason in result["failures"].items()
        ]
        with self._transaction():
            self._conn.execute(
                "INSERT OR REPLACE INTO evaluations VALUES (?,?,?,?,?,?,?,?,?,?)", row
            )
            self._conn.execute(
                "DELETE FROM evaluation_sites WHERE run_id = ? AND split = ?", (run_id, split)
            )
            self._conn.executemany(
                "INSERT INTO evaluation_sites VALUES (?, ?, ?, ?, ?, ?, ?)", site_rows
            )

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

    def site_rounds(self, run_id: str) -> pd.DataFrame:
        return self._frame(
            "SELECT * FROM site_rounds WHERE run_id = ? ORDER BY round, site", (run_id,)
        )

    def sites(self, run_id: str) -> pd.DataFrame:
        return self._frame("SELECT * FROM sites WHERE run_id = ? ORDER BY site", (run_id,))

    def model_evaluations(self, run_id: str) -> pd.DataFrame:
        return self._frame(
            "SELECT * FROM model_evaluations WHERE run_id = ? ORDER BY model, split, site",
            (run_id,),
        )

    def evaluations(self) -> pd.DataFrame:
        """Every recorded evaluation job (one row per run and split), newest first."""
        return self._frame("SELECT * FROM evaluations ORDER BY recorded_at DESC")

    def evaluation_sites(self, run_id: str, split: str = "test") -> pd.DataFrame:
        return self._frame(
            "SELECT * FROM evaluation_sites WHERE run_id = ? AND split = ? ORDER BY site",
            (run_id, split),
        )

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
