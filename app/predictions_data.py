"""The store's prediction jobs (``fed-auc predict``) as the table the Evaluations page shows
beside the evaluation jobs (no Streamlit here).

A job is listed on the run whose model it used (its model card's run id). The store holds
only counts and paths (``fed_auc.store.predictions``): how many images, how many could not be
read, how many were called positive at the card's threshold, where the CSV and the SRs are.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from app.queries import _frame, _has_table

SHOWN = ("recorded", "input", "images", "not read", "positive at threshold", "SRs", "output",
         "model sha256", "job")  # fmt: skip


def prediction_jobs(runs_dir: str | Path, run_id: str) -> pd.DataFrame:
    """The prediction jobs that used the model ``run_id`` trained, newest first; empty if
    none (or the store predates prediction jobs)."""
    if not _has_table(runs_dir, "predictions"):
        return pd.DataFrame(columns=["id", "model_run_id"])
    frame = _frame(
        runs_dir,
        "SELECT * FROM predictions WHERE model_run_id = ? ORDER BY recorded_at DESC",
        (run_id,),
    )
    for column in ("label_names", "positive_class", "thresholds", "positives"):
        frame[column] = frame[column].map(json.loads)
    return frame


def readable_jobs(frame: pd.DataFrame) -> pd.DataFrame:
    """One line per job as a person reads it: positives named by label, positive class and
    threshold ("Edema (present) ≥ 0.42: 7")."""
    rows = []
    for job in frame.itertuples():
        called = "; ".join(
            f"{label} ({positive}) ≥ {threshold:.3g}: {count}"
            for label, positive, threshold, count in zip(
                job.label_names, job.positive_class, job.thresholds, job.positives, strict=True
            )
        )
        rows.append(dict(zip(SHOWN, (
            pd.Timestamp(job.recorded_at, unit="s").strftime("%Y-%m-%d %H:%M"), job.input,
            job.n_images, job.n_failed, called,
            f"{job.sr_count} in {job.sr_dir}" if job.sr_dir else "—", job.output,
            job.model_sha256[:12], job.id,
        ), strict=True)))  # fmt: skip
    return pd.DataFrame(rows, columns=list(SHOWN))
