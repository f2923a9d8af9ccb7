"""Read-only access to the run store, as pandas tables the pages draw.

The dashboard never writes: the store is opened with SQLite's ``mode=ro`` URI, so a running
federation (WAL mode) keeps writing while the pages read. No Streamlit here, so this layer is
tested on its own; ``app/common.py`` caches it.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from fed_auc.store.facts import data_source
from fed_auc.store.run_store import STORE_FILE

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


class UnreadableStore(ValueError):
    """The store file is there but is not a fed-auc run store (not SQLite, or other tables)."""


def _frame(runs_dir: str | Path, sql: str, params: tuple[Any, ...] = ()) -> pd.DataFrame:
    conn = connect(runs_dir)
    try:
        return pd.read_sql_query(sql, conn, params=params)
    except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:
        reason = str(exc.__cause__ or exc)  # SQLite's words, not pandas' echo of the query
        raise UnreadableStore(
            f"{store_path(runs_dir)} is not a fed-auc run store (SQLite: {reason}); point the "
            "dashboard at the runs directory a run wrote (`fed-auc dashboard --runs-dir DIR`)"
        ) from None
    finally:
        conn.close()


def _loads(text: Any) -> Any:
    """JSON of one cell; repeated texts (``[30]``, ``{"undefined": []}``) are decoded once
    (the pages only read these values, never change them)."""
    return _decode(text) if isinstance(text, str) else None


@functools.lru_cache(maxsize=8192)
def _decode(text: str) -> Any:
    return json.loads(text)


def runs(runs_dir: str | Path) -> pd.DataFrame:
    """Every run, newest first, with what tells runs apart: algorithm, data source, transport,
    number of sites (its data cards, else the sites of its rounds: a warm-up run records no
    cards), whether the data are synthetic, final AUC; and a label for pickers."""
    frame = _frame(
        runs_dir,
        "SELECT runs.*, (SELECT MAX(round) FROM rounds WHERE run_id = runs.id) AS last_round,"
        " (SELECT global_auc FROM rounds WHERE run_id = runs.id ORDER BY round DESC LIMIT 1)"
        " AS last_auc, COALESCE(NULLIF((SELECT COUNT(*) FROM sites WHERE run_id = runs.id), 0),"
        " (SELECT COUNT(DISTINCT site) FROM site_rounds WHERE run_id = runs.id)) AS n_sites,"
        " (SELECT MIN(json_extract(summary, '$.source') = 'synthetic') FROM sites"
        " WHERE run_id = runs.id) AS synthetic, (SELECT json_group_array(json_object('site',"
        " site, 'positive_class', json(json_extract(summary, '$.positive_class'))))"
        " FROM sites WHERE run_id = runs.id) AS classes FROM runs ORDER BY started_at DESC",
    )
    frame["config"] = frame["config"].map(_loads)
    frame["summary"] = frame["summary"].map(_loads)
    frame["data_source"] = frame["config"].map(data_source)
    frame["transport"] = frame["config"].map(lambda c: (c or {}).get("transport", "local"))
    frame["synthetic"] = frame["synthetic"].fillna(0).astype(bool)
    cards = dict(zip(frame["id"], frame["classes"].map(_loads), strict=True))
    frame["positive_class"] = [  # a warm-up's sites are its main run's
        positive_class(cards.get(id_) or cards.get(warmup_for({"config": c}), None) or [])
        for id_, c in zip(frame["id"], frame["config"], strict=True)
    ]
    heads = [headline_auc(row) for row in frame.to_dict("records")]
    frame["final_auc"] = [auc for auc, _ in heads]
    frame["auc_of"] = [of for _, of in heads]
    frame["label"] = [run_label(row) for row in frame.to_dict("records")]
    frame["derived_from"] = derived_from(runs_dir, frame)
    return frame


def derived_from(runs_dir: str | Path, frame: pd.DataFrame) -> list[list[str]]:
    """Per run of ``frame``, the runs it derives from directly, so that a restriction on one
    covers the others (``app.access.lineage``): the main run of a warm-up (config
    ``warmup_for``), the run whose model an evaluation job scored (``model_run_id``), and the
    run whose export a run started from (config ``init`` inside the runs directory)."""
    scored: dict[str, set[str]] = {}
    if _has_table(runs_dir, "evaluations"):
        rows = _frame(
            runs_dir,
            "SELECT DISTINCT run_id, model_run_id FROM evaluations"
            " WHERE model_run_id IS NOT NULL AND model_run_id != run_id",
        )
        for job, model_run in zip(rows["run_id"], rows["model_run_id"], strict=True):
            scored.setdefault(job, set()).add(model_run)
    root = Path(runs_dir).resolve()
    sources = []
    for run_id, config in zip(frame["id"], frame["config"], strict=True):
        found = set(scored.get(run_id, ()))
        if warmup_for({"config": config}):
            found.add(warmup_for({"config": config}))
        init = (config or {}).get("init")
        if isinstance(init, str) and Path(init).resolve().is_relative_to(root):
            parts = Path(init).resolve().relative_to(root).parts
            if parts:
                found.add(parts[0])  # a run's files live in <runs dir>/<run id>/
        sources.append(sorted(found - {run_id}))
    return sources


def is_training(run: dict[str, Any]) -> bool:
    """A run that trained a model of its own: not an evaluation job (algorithm ``evaluate``)
    and not the warm-up of another run (config ``warmup_for``)."""
    return run["algorithm"] != "evaluate" and not warmup_for(run)


def warmup_for(run: dict[str, Any]) -> str | None:
    """The main run a warm-up run warm-started (config ``warmup_for``), else None."""
    return (run.get("config") or {}).get("warmup_for")


def positive_class(summaries: Any) -> str:
    """The class a run's AUCs, sensitivities and ROC curves are about, from its sites' data
    cards (``positive_class``); runs recorded before cards named it say so. (The rule of
    ``fed_auc.data.labels.federation_positive_class``: the app imports no data code.)"""
    per_label: list[dict[str, list[str]]] = []  # per label: name → sites
    for card in summaries:
        if not isinstance(card, dict):
            continue
        for j, name in enumerate(card.get("positive_class") or []):
            if j == len(per_label):
                per_label.append({})
            per_label[j].setdefault(name, []).append(str(card.get("site", "?")))
    if not per_label:
        return "not recorded (the files' label value 1)"
    return ", ".join(
        next(iter(names))
        if len(names) == 1
        else " / ".join(f"{n} ({', '.join(s)})" for n, s in names.items())
        for names in per_label
    )


EXPORTED_AUC = "export"  # what ``final_auc`` is, per kind of run: the exported model's
LAST_ROUND_AUC = "last round"
JOB_AUC = "evaluation"  # its pooled test AUC
JOB_SITE_AUC = "evaluation, 1 site"  # a job of one site: that site's


def headline_auc(run: dict[str, Any]) -> tuple[float | None, str]:
    """A run's one AUC for lists (the picker, All runs, Compare) and what it is: the exported
    model's pooled test AUC (its model card's, as ``fed_auc.run.headline`` prints it), else
    the last round's; an evaluation job's pooled test AUC (the mean over its labels), else its
    only site's."""
    summary = run["summary"] if isinstance(run.get("summary"), dict) else {}
    if run["algorithm"] == "evaluate":
        per_site = (summary.get("auc") or {}).get("test") or {}
        values = per_site.get("pooled") or (next(iter(per_site.values())) if per_site else [])
        defined = [v for v in values or [] if v is not None]
        of = JOB_AUC if "pooled" in per_site else JOB_SITE_AUC
        return (sum(defined) / len(defined) if defined else None), of
    if "exported_auc" in summary:
        return summary["exported_auc"], EXPORTED_AUC
    last = run.get("last_auc")
    return (None if last is None or last != last else float(last)), LAST_ROUND_AUC


def run_label(run: dict[str, Any]) -> str:
    """algorithm · data source · transport · N sites · AUC (of what) · status · start · id:
    runs apart at a glance."""
    auc = run.get("final_auc")
    auc_text = "AUC –" if auc is None or auc != auc else f"AUC {auc:.3f} ({run['auc_of']})"
    started = pd.to_datetime(run["started_at"], unit="s").strftime("%m-%d %H:%M")
    warm = warmup_for(run)
    parts = [
        run["algorithm"] + (f" (warm-up of {warm})" if warm else ""),
        run["data_source"]
        + (" (synthetic)" if run["synthetic"] and run["data_source"] != "synthetic" else ""),
        run["transport"],
        f"{int(run['n_sites'])} sites",
        auc_text,
        run["status"],
        started,
        run["id"],
    ]
    return " · ".join(parts)


@dataclass
class RunData:
    """Everything the pages show about one run."""

    run: dict[str, Any]
    rounds: pd.DataFrame
    site_rounds: pd.DataFrame
    sites: pd.DataFrame
    events: pd.DataFrame
    evaluations: pd.DataFrame  # model_evaluations rows, ``labels`` decoded (may be empty)
    scoring_job: pd.DataFrame  # scoring_job's rows (may be empty)

    @property
    def planned_rounds(self) -> int | None:
        """The rounds the run planned: a warm-up run plans ``warmup_rounds`` (its config is
        its main run's, whose ``rounds`` are the main run's)."""
        config = self.run["config"] or {}
        value = config.get("warmup_rounds") if warmup_for(self.run) else config.get("rounds")
        return int(value) if value is not None else None

    @property
    def warmup_for(self) -> str | None:
        return warmup_for(self.run)


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
    columns = _frame(runs_dir, "SELECT name FROM pragma_table_info('site_rounds')")["name"]
    plain = ", ".join(c for c in columns if c != "metrics")
    site_rounds = _frame(
        runs_dir,
        f"SELECT {plain}, json_remove(metrics, '$.roc') AS metrics"
        " FROM site_rounds WHERE run_id = ? ORDER BY round, site",
        (run_id,),
    )  # ROC points are most of the bytes: read per round, when a page draws them (roc_points)
    for column in _JSON_COLUMNS:
        site_rounds[column] = site_rounds[column].map(_loads)
    sites = _frame(runs_dir, "SELECT * FROM sites WHERE run_id = ? ORDER BY site", (run_id,))
    main = warmup_for(match.iloc[0].to_dict())
    if sites.empty and main:  # a warm-up trains on its main run's sites: their data cards
        sites = _frame(runs_dir, "SELECT * FROM sites WHERE run_id = ? ORDER BY site", (main,))
    sites["summary"] = sites["summary"].map(_loads)
    events = _frame(runs_dir, "SELECT * FROM events WHERE run_id = ? ORDER BY id", (run_id,))
    evaluations = pd.DataFrame(columns=["run_id", "model", "split", "site", "labels"])
    if _has_table(runs_dir, "model_evaluations"):  # stores written before it lack the table
        evaluations = _frame(
            runs_dir, "SELECT * FROM model_evaluations WHERE run_id = ? ORDER BY site", (run_id,)
        )
        evaluations["labels"] = evaluations["labels"].map(_loads)
    job = scoring_job(runs_dir, run_id)
    return RunData(match.iloc[0].to_dict(), rounds, site_rounds, sites, events, evaluations, job)


def scoring_job(runs_dir: str | Path, run_id: str) -> pd.DataFrame:
    """The newest evaluation job that scored the test split of the model ``run_id`` trained:
    its run id (``job``), and per reporting site the labels' results (decoded ``labels``,
    with the job's bootstrap CIs). Empty if no job did."""
    if not _has_table(runs_dir, "evaluations"):
        return pd.DataFrame(columns=["job", "site", "labels"])
    frame = _frame(
        runs_dir,
        "SELECT run_id AS job, site, labels FROM evaluation_sites WHERE status = 'reported'"
        " AND (run_id, split) = (SELECT run_id, split FROM evaluations WHERE model_run_id = ?"
        " AND split = 'test' ORDER BY recorded_at DESC LIMIT 1) ORDER BY site",
        (run_id,),
    )
    frame["labels"] = frame["labels"].map(_loads)
    return frame


def roc_points(runs_dir: str | Path, run_id: str, round_: int) -> dict[str, list[dict]]:
    """Per site, the stored ROC points (one dict per label) of one round."""
    frame = _frame(
        runs_dir,
        "SELECT site, json_extract(metrics, '$.roc') AS roc FROM site_rounds"
        " WHERE run_id = ? AND round = ? AND json_type(metrics, '$.roc') = 'array'"
        " ORDER BY site",
        (run_id, round_),
    )
    return {site: json.loads(roc) for site, roc in zip(frame["site"], frame["roc"], strict=True)}


def comparisons(runs_dir: str | Path, run_ids: list[str]) -> pd.DataFrame:
    """The recorded paired comparisons (``fed-auc runs --compare``) between any two of
    ``run_ids``: a row per pair, site and label; empty where none is (or the store predates
    the table)."""
    if len(run_ids) < 2 or not _has_table(runs_dir, "comparisons"):
        return pd.DataFrame(columns=["run_a", "run_b", "site", "label"])
    marks = ", ".join("?" for _ in run_ids)
    return _frame(
        runs_dir,
        f"SELECT * FROM comparisons WHERE run_a IN ({marks}) AND run_b IN ({marks})"
        " ORDER BY run_a, run_b, split, site = 'pooled', site, label",
        (*run_ids, *run_ids),
    )


def _has_table(runs_dir: str | Path, name: str) -> bool:
    found = _frame(
        runs_dir, "SELECT name FROM sqlite_master WHERE type='table' AND name=?", (name,)
    )
    return not found.empty
