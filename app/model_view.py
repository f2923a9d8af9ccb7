"""Which model a page describes, and which sites each of its numbers covers. Pure pandas.

The headline is the model the run exported (its round, or the mean of several rounds, and its
card's threshold); the last round is the second view. A site that did not answer is "not
scored since round r" with its last AUC, never "AUC undefined" (that means a one-class test
split); pooled, mean and worst figures name the set of sites they cover.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from app.queries import RunData
from app.tables import auc_header, ci_header, readable
from fed_auc.metrics.wording import BOOTSTRAP, HANLEY_MCNEIL, interval_text, selected_text

EXPORTED = "exported"  # fed_auc.run.lifecycle.EXPORTED: the store's name for the exported model
LAST = "last"
MIN_CLASS_COUNT = 10  # fewer test positives or negatives than this: the AUC is mostly noise


@dataclass(frozen=True)
class ModelChoice:
    """A model a page can describe: the exported one or the last round's global model."""

    key: str
    round: int
    title: str
    thresholds: list[float]
    threshold_note: str
    ci_method: str = HANLEY_MCNEIL  # how its per-site 95 % CIs were computed
    ci_source: str = "the round's evaluation at each site"

    @property
    def caption(self) -> str:
        return f"{self.title}; test split of each site"

    @property
    def ci_text(self) -> str:
        """How its per-site AUC intervals were computed, beside them on the page."""
        return f"95 % CIs of the site AUCs: {self.ci_method} ({self.ci_source})"


def thresholds_of(data: RunData) -> tuple[list[float], str]:
    """The card's operating thresholds per label and where they come from."""
    summary = data.run.get("summary") or {}
    chosen = summary.get("threshold")
    if chosen:
        return [float(t) for t in chosen], "Youden's J on pooled validation scores"
    return [0.5] * max(1, _num_labels(data)), "the run chose none: 0.5"


def _num_labels(data: RunData) -> int:
    return int((data.run.get("config") or {}).get("num_labels", 1))


def choices(data: RunData) -> list[ModelChoice]:
    """The exported model first (when the run exported one), then the last evaluated round."""
    thresholds, note = thresholds_of(data)
    summary = data.run.get("summary") or {}
    planned = data.planned_rounds or "?"
    out = []
    if summary.get("selected_round") is not None:
        selected = int(summary["selected_round"])
        averaged = summary.get("averaged_rounds")
        what = (
            f"mean of the weights of rounds {averaged}"
            if averaged
            else f"round {selected} of {planned}"
        )
        stages = summary.get("selected") or []
        if any(entry["stage"] != "main" for entry in stages):  # warm-up or --init: named
            what = selected_text(stages)
            what = f"mean of the weights of {what}" if len(stages) > 1 else what
        job = scoring_job(data)
        method, source = (
            (HANLEY_MCNEIL, "the export's own evaluation at each site")
            if job is None
            else (BOOTSTRAP, f"evaluation job {job}, as on the Evaluations page")
        )
        title = f"Exported model ({what})"
        out.append(ModelChoice(EXPORTED, selected, title, thresholds, note, method, source))
    evaluated = data.site_rounds.loc[data.site_rounds["n_test"].notna(), "round"]
    last = int(evaluated.max()) if not evaluated.empty else int(data.rounds["round"].max())
    out.append(ModelChoice(LAST, last, f"Last round ({last} of {planned})", thresholds, note))
    return out


def scoring_job(data: RunData) -> str | None:
    """The evaluation job whose per-site results stand for the exported model's test AUC: the
    newest that scored it at every site its own evaluation covered (its bootstrap CIs, so the
    same model and split show one interval wherever they appear); None if there is none."""
    job = data.scoring_job
    if job.empty:
        return None
    covered = set(data.evaluations["site"]) if not data.evaluations.empty else set()
    return str(job["job"].iloc[0]) if covered <= set(job["site"]) else None


def all_sites(data: RunData) -> list[str]:
    """Every site the run knows: from the data cards and from any round."""
    return sorted(set(data.sites["site"].unique()) | set(data.site_rounds["site"].unique()))


def _rows_at(data: RunData, choice: ModelChoice) -> pd.DataFrame:
    """Per scored site: auc, auc_lo, auc_hi, n_test, positives, negatives, note."""
    evaluations = data.evaluations
    if choice.key == EXPORTED and scoring_job(data) is not None:  # labels: name → result
        evaluations = data.scoring_job.assign(
            labels=[
                [{**r, "auc_lo": r["ci_lo"], "auc_hi": r["ci_hi"]} for r in labels.values()]
                for labels in data.scoring_job["labels"]
            ]
        )
    if choice.key == EXPORTED and not evaluations.empty:
        rows = []
        for site, labels in zip(evaluations["site"], evaluations["labels"], strict=True):
            defined = [x["auc"] for x in labels if x.get("auc") is not None]
            single = labels[0] if len(labels) == 1 else {}
            n = labels[0]["n"] if labels else None
            rows.append(
                {
                    "site": site,
                    "auc": float(np.mean(defined)) if defined else None,
                    "auc_lo": single.get("auc_lo"),
                    "auc_hi": single.get("auc_hi"),
                    "n_test": n,
                    "positives": labels[0]["positives"] if labels else None,
                    "note": "; ".join(x["note"] for x in labels if x.get("note")),
                }
            )
        return pd.DataFrame(rows).set_index("site")
    at = data.site_rounds[
        (data.site_rounds["round"] == choice.round) & data.site_rounds["n_test"].notna()
    ]
    positives = at["test_positives"].map(lambda p: p[0] if isinstance(p, list) and p else None)
    notes = at["metrics"].map(lambda m: "; ".join((m or {}).get("undefined") or []))
    return pd.DataFrame(
        {
            "site": at["site"],
            "auc": at["auc"],
            "auc_lo": at["auc_lo"],
            "auc_hi": at["auc_hi"],
            "n_test": at["n_test"],
            "positives": positives,
            "note": notes,
        }
    ).set_index("site")


def _last_scored(data: RunData, site: str, before: int) -> tuple[int | None, float | None]:
    rows = data.site_rounds
    rows = rows[(rows["site"] == site) & (rows["round"] < before) & rows["n_test"].notna()]
    if rows.empty:
        return None, None
    last = rows.iloc[-1]
    return int(last["round"]), None if pd.isna(last["auc"]) else float(last["auc"])


def _unscored_since(data: RunData, site: str, round_: int) -> int:
    """The first round of the run of rounds up to ``round_`` in which the site went unscored."""
    rows = data.site_rounds
    scored = rows.loc[(rows["site"] == site) & rows["n_test"].notna(), "round"]
    scored = scored[scored <= round_]
    evaluated = sorted(
        rows.loc[rows["n_test"].notna() & (rows["round"] <= round_), "round"].unique()
    )
    after = [r for r in evaluated if scored.empty or r > scored.max()]
    return int(after[0]) if after else round_


def site_status(data: RunData, choice: ModelChoice) -> pd.DataFrame:
    """One row per site of the run: scored or not, AUC with CI, counts, and a note.

    A site that is not scored says since when, what its training status was, and its last
    AUC; ``few cases`` marks sites with fewer than ``MIN_CLASS_COUNT`` test positives or
    negatives. Sorted by the lower 95 % bound (the site we are least sure works first).
    """
    rows = _rows_at(data, choice)
    statuses = data.site_rounds[data.site_rounds["round"] == choice.round].set_index("site")
    out = []
    for site in all_sites(data):
        status = statuses["status"].get(site, "absent") if not statuses.empty else "absent"
        entry: dict[str, Any] = {"site": site, "scored": site in rows.index}
        if entry["scored"]:
            row = rows.loc[site]
            n = row["n_test"]
            pos = row["positives"]
            neg = None if n is None or pos is None or pd.isna(n) else int(n) - int(pos)
            auc = row["auc"]
            entry |= {
                "AUC": auc,
                "CI low": row["auc_lo"],
                "CI high": row["auc_hi"],
                "positives": pos,
                "negatives": neg,
                "few cases": pos is not None
                and neg is not None
                and min(int(pos), neg) < MIN_CLASS_COUNT,
                "note": row["note"] or ("" if pd.notna(auc) else "AUC undefined: one class"),
            }
        else:
            from_export = choice.key == EXPORTED and not data.evaluations.empty
            since = _unscored_since(data, site, choice.round)
            last_round, last_auc = _last_scored(
                data, site, int(data.site_rounds["round"].max()) + 1 if from_export else since
            )
            last = (
                "never scored"
                if last_round is None
                else f"last AUC {last_auc:.3f} at round {last_round}"
                if last_auc is not None
                else f"last scored at round {last_round} (AUC undefined)"
            )
            entry |= {
                "AUC": None,
                "CI low": None,
                "CI high": None,
                "positives": None,
                "negatives": None,
                "few cases": False,
                "note": f"the exported model was not scored here (no answer); {last}"
                if from_export
                else f"not scored since round {since} ({status}); {last}",
            }
        entry["status"] = status
        out.append(entry)
    table = pd.DataFrame(out)
    for column in ("AUC", "CI low", "CI high"):
        table[column] = pd.to_numeric(table[column], errors="coerce")
    return table.sort_values(["CI low", "AUC"], na_position="last", kind="stable").reset_index(
        drop=True
    )


@dataclass(frozen=True)
class Coverage:
    """Which sites a pooled / mean / worst figure covers."""

    scored: list[str]
    defined: list[str]
    missing: list[str]
    total: int
    mean_auc: float | None
    worst_site: str | None
    worst_auc: float | None

    def sentence(self) -> str:
        text = f"{len(self.scored)} of {self.total} sites scored"
        if len(self.defined) < len(self.scored):
            text += f", {len(self.scored) - len(self.defined)} with a one-class test split"
        return text


def coverage(table: pd.DataFrame) -> Coverage:
    """The stated set of a ``site_status`` table: mean and worst AUC over the scored sites
    whose AUC is defined."""
    scored = table[table["scored"]]
    defined = scored.dropna(subset=["AUC"])
    worst = defined.loc[defined["AUC"].idxmin()] if not defined.empty else None
    return Coverage(
        scored=scored["site"].tolist(),
        defined=defined["site"].tolist(),
        missing=table.loc[~table["scored"], "site"].tolist(),
        total=len(table),
        mean_auc=float(defined["AUC"].mean()) if not defined.empty else None,
        worst_site=None if worst is None else worst["site"],
        worst_auc=None if worst is None else float(worst["AUC"]),
    )


def scored_per_round(data: RunData) -> pd.DataFrame:
    """Per evaluated round: how many sites were scored out of how many the run has."""
    rows = data.site_rounds
    evaluated = rows[rows["n_test"].notna()]
    counts = evaluated.groupby("round")["site"].nunique()
    frame = counts.rename("scored").reset_index()
    frame["sites"] = len(all_sites(data))
    return frame


def readable_status(
    table: pd.DataFrame, extra: pd.DataFrame | None, positive: str, method: str
) -> pd.DataFrame:
    """The per-site table as read: AUC named by its positive class, the 95 % CI as one cell
    named by its method, counts as integers, "—" where there is no value."""
    shown = table.drop(columns=["scored"])
    if extra is not None:
        keep = [c for c in extra.columns if c.startswith("prevalence") or c in (
            "n train", "personal AUC", "last round trained")]  # fmt: skip
        shown = shown.join(extra[keep], on="site")
    ci = [interval_text(lo, hi) for lo, hi in zip(shown["CI low"], shown["CI high"], strict=True)]
    shown = shown.drop(columns=["CI high"]).rename(columns={"CI low": ci_header(method)})
    shown[ci_header(method)] = ci
    counts = ("positives", "negatives", "n train", "last round trained")
    texts = ("site", "note", "status", ci_header(method))
    digits = {c: 0 for c in counts} | {c: None for c in texts}
    return readable(shown, digits).rename(
        columns={"AUC": auc_header(positive), "personal AUC": auc_header(positive, "personal AUC")}
    )
