"""The store's ``predictions`` table: one row per ``fed-auc predict`` job, so the dashboard
lists prediction jobs beside evaluation jobs.

Only what can leave the site's scoring machine for anyone who reads the store: counts, the
model's identity and paths. No score, no patient or study identifier, no image name: the
per-image results stay in the job's CSV and SRs, where the site keeps them.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import pandas as pd

PREDICTION_SCHEMA = """
CREATE TABLE IF NOT EXISTS predictions (
    id TEXT PRIMARY KEY,              -- the job's id
    recorded_at REAL NOT NULL,
    model TEXT NOT NULL,              -- path of the model.pt scored with
    model_run_id TEXT,                -- the run that trained it (its model card's run_id)
    model_sha256 TEXT NOT NULL,       -- of that model.pt
    label_names TEXT NOT NULL,        -- JSON list
    positive_class TEXT NOT NULL,     -- JSON list, per label
    thresholds TEXT NOT NULL,         -- JSON list, per label: the card's operating threshold
    input TEXT NOT NULL,              -- what was scored: "folder PATH", "csv PATH", a query
    n_images INTEGER NOT NULL,        -- images the input named
    n_failed INTEGER NOT NULL,        -- of which could not be read (named in the CSV)
    positives TEXT NOT NULL,          -- JSON list, per label: decisions "positive"
    output TEXT NOT NULL,             -- the prediction CSV
    sr_dir TEXT,                      -- where the structured reports went (NULL: none asked)
    sr_count INTEGER NOT NULL,        -- structured reports written
    calibrated INTEGER NOT NULL       -- 1: the card had a calibration (probabilities filled)
);
"""
COLUMNS = ("model", "model_run_id", "model_sha256", "label_names", "positive_class",
           "thresholds", "input", "n_images", "n_failed", "positives", "output", "sr_dir",
           "sr_count", "calibrated")  # fmt: skip
LISTS = ("label_names", "positive_class", "thresholds", "positives")


class PredictionTables:
    """The predictions table's writes and reads, for ``RunStore``."""

    _conn: sqlite3.Connection
    _transaction: Callable[[], AbstractContextManager[None]]
    _frame: Callable[..., pd.DataFrame]

    def record_prediction(self, job: Mapping[str, Any], job_id: str | None = None) -> str:
        """One prediction job (keys ``COLUMNS``; lists as lists); returns its id."""
        job_id = job_id or time.strftime("predict-%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        values = [json.dumps(job[c]) if c in LISTS else job.get(c) for c in COLUMNS]
        marks = ", ".join("?" for _ in range(len(COLUMNS) + 2))
        with self._transaction():
            self._conn.execute(
                f"INSERT INTO predictions (id, recorded_at, {', '.join(COLUMNS)}) VALUES ({marks})",
                (job_id, time.time(), *values),
            )
        return job_id

    def predictions(self, model_run_ids: Sequence[str] | None = None) -> pd.DataFrame:
        """Prediction jobs, newest first (of these models' runs only, if given)."""
        if model_run_ids is None:
            return self._frame("SELECT * FROM predictions ORDER BY recorded_at DESC")
        marks = ", ".join("?" for _ in model_run_ids) or "NULL"
        return self._frame(
            f"SELECT * FROM predictions WHERE model_run_id IN ({marks}) ORDER BY recorded_at DESC",
            tuple(model_run_ids),
        )
