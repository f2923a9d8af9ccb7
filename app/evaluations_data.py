"""The store's evaluation jobs as tables the Evaluations page draws (no Streamlit here).

One job: a model scored at every site of a federation (``fed_auc.evaluate.job``), recorded
under the run that did it. Per site and label: AUC with the node's bootstrap CI, held out or
not, or why the site did not report; the pooled AUC from the sites' binned counts with its CI,
the binning's error bound and the sites it covers; the operating point at the card's threshold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from app.queries import _frame, _has_table
from app.tables import auc_header, readable
from fed_auc.metrics.operating_point import ScoreBins
from fed_auc.metrics.wording import BINNED_BOOTSTRAP, BOOTSTRAP, interval_text

POOLED_SCORES = "scores"  # fed_auc.evaluate.job.POOLED_SCORES: pooled from the scores

POOLED = "pooled"


def jobs(runs_dir: str | Path, run_id: str) -> pd.DataFrame:
    """The evaluation jobs of one run (one row per job run and split), newest first: those
    recorded under it (an evaluation-only run, a hold-out run scoring its export) and those
    that scored the model it trained (``model_run_id``, from the model's card), wherever
    they were recorded; empty if none."""
    if not _has_table(runs_dir, "evaluations"):  # stores written before evaluation jobs
        return pd.DataFrame(columns=["run_id", "split", "model", "label_names", "held_out"])
    frame = _frame(
        runs_dir,
        "SELECT * FROM evaluations WHERE run_id = ? OR model_run_id = ?"
        " ORDER BY run_id = ? DESC, recorded_at DESC, run_id, split DESC",
        (run_id, run_id, run_id),
    )
    for column in ("label_names", "held_out", "pooled", "failures"):
        frame[column] = frame[column].map(lambda v: json.loads(v) if isinstance(v, str) else None)
    return frame


def site_rows(runs_dir: str | Path, run_id: str, split: str) -> pd.DataFrame:
    frame = _frame(
        runs_dir,
        "SELECT * FROM evaluation_sites WHERE run_id = ? AND split = ? ORDER BY site",
        (run_id, split),
    )
    frame["labels"] = frame["labels"].map(lambda v: json.loads(v) if isinstance(v, str) else None)
    return frame


def forest(job: pd.Series, sites: pd.DataFrame, label: str) -> pd.DataFrame:
    """One row per reporting site (and pooled): AUC, CI, kind (trained on / held out / pooled)
    and the text shown when the AUC is undefined."""
    rows = []
    for row in sites.itertuples():
        if row.labels is None:
            continue
        r = row.labels[label]
        kind = "held out" if row.held_out else "trained on"
        rows.append(_forest_row(row.site, r, kind, BOOTSTRAP))
    pooled = (job["pooled"] or {}).get(label)
    if pooled is not None:
        covered = ", ".join(pooled.get("pooled_sites", []))
        rows.append(_forest_row(f"pooled ({covered})", pooled, POOLED, pooled_method(pooled)))
    return pd.DataFrame(rows)


def pooled_method(pooled: dict[str, Any]) -> str:
    """How a pooled entry's CI was made: a bootstrap of the scores pooled where they were
    scored (local evaluation), else of the sites' summed score counts (stores written before
    ``pooled_from`` recorded only the latter)."""
    return BOOTSTRAP if pooled.get("pooled_from") == POOLED_SCORES else BINNED_BOOTSTRAP


def _forest_row(site: str, r: dict[str, Any], kind: str, method: str) -> dict[str, Any]:
    return {
        "site": site,
        "kind": kind,
        "n": r["n"],
        "positives": r["positives"],
        "auc": r["auc"],
        "ci_lo": r["ci_lo"],
        "ci_hi": r["ci_hi"],
        "method": method,
        "error_bound": r.get("auc_error_bound"),
        "note": r.get("note") or "",
    }


def readable_forest(frame: pd.DataFrame, positive: str) -> pd.DataFrame:
    """The forest plot's rows as a table a person reads: the AUC named by its positive class
    (or why it is undefined), the 95 % CI as one cell beside its method, counts as integers,
    the binning's error bound where there is one, "—" for what there is not."""
    pooled = frame["kind"] == POOLED
    shown = pd.DataFrame(
        {  # the pooled row's sites are in the plot and the caption: "pooled (4 sites)" here
            "site": frame["site"].where(~pooled, f"pooled ({frame['site'].size - 1} sites)"),
            "kind": frame["kind"],
            "n": frame["n"],
            "positives": frame["positives"],
            auc_header(positive): [
                r.note if r.auc is None or r.auc != r.auc else f"{r.auc:.3f}"
                for r in frame.itertuples()
            ],
            "95 % CI": [interval_text(r.ci_lo, r.ci_hi) for r in frame.itertuples()],
            "CI method": frame["method"],
            "bin error ≤": frame["error_bound"],
        }
    )
    return readable(shown, dict.fromkeys(shown.columns) | {"n": 0, "positives": 0,
                                                           "bin error ≤": 4})  # fmt: skip


def failures(job: pd.Series) -> pd.DataFrame:
    """Sites that did not report, with the reason (a crash, a deadline, an unknown format)."""
    items = (job["failures"] or {}).items()
    return pd.DataFrame(
        [{"site": s, "reason": why} for s, why in items], columns=["site", "reason"]
    )


def label_bins(job: pd.Series, sites: pd.DataFrame, label: str) -> dict[str, ScoreBins]:
    """Per reporting site and pooled, the score counts of one label (checked as they load)."""
    out = {}
    for row in sites.itertuples():
        if row.labels is not None and row.labels[label].get("bins"):
            out[row.site] = ScoreBins.from_dict(row.labels[label]["bins"], f"site {row.site}")
    pooled = (job["pooled"] or {}).get(label)
    if pooled is not None and pooled.get("bins"):
        out[POOLED] = ScoreBins.from_dict(pooled["bins"], "pooled")
    return out
