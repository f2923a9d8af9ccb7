"""The store's ``comparisons`` table: two runs' exported models scored on the same test images,
per site (and pooled, or over a federation combined) and label, with the paired interval of
their AUC difference (``fed_auc.evaluate.compare``, ``fed_auc.evaluate.federated_compare``).
Recorded where the images are, so the dashboard, which never loads images, can show it;
nothing per image is stored."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import pandas as pd

from fed_auc.metrics.paired import FIXED_EFFECT

COMPARISON_SCHEMA = """
CREATE TABLE IF NOT EXISTS comparisons (
    run_a TEXT NOT NULL REFERENCES runs(id),
    run_b TEXT NOT NULL REFERENCES runs(id),
    split TEXT NOT NULL,
    site TEXT NOT NULL,               -- a site, "pooled": all sites' images together, or (over
                                      -- a federation) "combined (fixed effect)": the sites'
                                      -- differences' inverse-variance weighted mean
    label TEXT NOT NULL,
    positive_class TEXT,              -- the class this label's AUCs are about
    auc_a REAL,
    auc_b REAL,
    difference REAL,                  -- auc_a − auc_b
    lo REAL,                          -- its interval at `level`
    hi REAL,
    se REAL,
    p_value REAL,                     -- two-sided, of no difference
    level REAL NOT NULL,
    n INTEGER NOT NULL,               -- test images both models scored
    positives INTEGER NOT NULL,
    method TEXT NOT NULL,             -- DeLong
    reason TEXT,                      -- why a figure is missing (a one-class split)
    recorded_at REAL NOT NULL,
    PRIMARY KEY (run_a, run_b, split, site, label)
);
"""
COLUMNS = (
    "site", "label", "positive_class", "auc_a", "auc_b", "difference", "lo", "hi", "se",
    "p_value", "level", "n", "positives", "method", "reason",
)  # fmt: skip


class ComparisonTables:
    """The comparisons table's writes and reads, for ``RunStore``."""

    _conn: sqlite3.Connection
    _transaction: Callable[[], AbstractContextManager[None]]
    _frame: Callable[..., pd.DataFrame]

    def record_comparison(
        self, run_a: str, run_b: str, split: str, rows: Sequence[Mapping[str, Any]]
    ) -> None:
        """One comparison of ``run_a`` against ``run_b``: a row per site and label (keys
        ``COLUMNS``). Replaces an earlier record of the same two runs and split, whole."""
        now = time.time()
        values = [(run_a, run_b, split, *(row.get(c) for c in COLUMNS), now) for row in rows]
        marks = ", ".join("?" for _ in range(len(COLUMNS) + 4))
        with self._transaction():
            self._conn.execute(
                "DELETE FROM comparisons WHERE run_a = ? AND run_b = ? AND split = ?",
                (run_a, run_b, split),
            )
            self._conn.executemany(
                f"INSERT INTO comparisons (run_a, run_b, split, {', '.join(COLUMNS)},"
                f" recorded_at) VALUES ({marks})",
                values,
            )

    def comparisons(self, run_a: str, run_b: str, split: str = "test") -> pd.DataFrame:
        """The recorded comparison of ``run_a`` against ``run_b`` (empty if none): the sites,
        then the pooled or combined row."""
        return self._frame(
            "SELECT * FROM comparisons WHERE run_a = ? AND run_b = ? AND split = ?"
            " ORDER BY site = 'pooled' OR site = ?, site, label",
            (run_a, run_b, split, FIXED_EFFECT),
        )
