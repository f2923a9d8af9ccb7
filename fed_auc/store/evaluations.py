"""The store's evaluation tables: a run's model scored per site (``model_evaluations``), and
evaluation jobs, local or federated, with one row per site (``evaluations``,
``evaluation_sites``). ``RunStore`` reads and writes them through ``EvaluationTables``."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import pandas as pd

EVALUATION_SCHEMA = """
CREATE TABLE IF NOT EXISTS model_evaluations (
    run_id TEXT NOT NULL REFERENCES runs(id),
    model TEXT NOT NULL,              -- "exported": the model the run exported; else a job name
    split TEXT NOT NULL,
    site TEXT NOT NULL,
    labels TEXT NOT NULL,             -- JSON list per label: n, positives, threshold, AUC + CI,
                                      -- score bins (metrics.operating_point.ScoreBins.to_dict)
    recorded_at REAL NOT NULL,
    PRIMARY KEY (run_id, model, split, site)
);
CREATE TABLE IF NOT EXISTS evaluations (
    run_id TEXT NOT NULL REFERENCES runs(id), -- the run that scored it: an evaluation-only run
                                      -- (federated, or local on site files), or a hold-out
                                      -- training run scoring its export
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
    labels TEXT,                      -- JSON per label: metrics.report.label_result's
    PRIMARY KEY (run_id, split, site)
);
"""


class EvaluationTables:
    """The evaluation tables' writes and reads, for ``RunStore`` (its connection, transactions
    and frames)."""

    _conn: sqlite3.Connection
    _transaction: Callable[[], AbstractContextManager[None]]
    _frame: Callable[..., pd.DataFrame]

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
        """An evaluation job's split (``fed_auc.evaluate.job.combine``, federated or local):
        the job's row and one row per site, failures included, in one transaction."""
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
