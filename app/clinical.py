"""What a clinician reads about the exported model at its operating point, per site and
pooled: counts, sensitivity / specificity / PPV / NPV with Wilson CIs, sensitivity at fixed
specificities, calibration and Brier score. Pure pandas over the store's binned score counts
(``fed_auc.metrics.operating_point`` does the arithmetic); no per-image score exists to read.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from app.model_view import EXPORTED
from app.queries import RunData
from fed_auc.metrics.operating_point import (
    EDGE_TOLERANCE,
    ScoreBins,
    at_threshold,
    curve,
    figures,
    pool,
    reliability,
)

POOLED = "pooled"


def exported_bins(data: RunData, label: int) -> dict[str, ScoreBins]:
    """Per site, the exported model's score counts of one label (checked as they load)."""
    rows = data.evaluations
    rows = rows[(rows["model"] == EXPORTED) & (rows["split"] == "test")]
    out = {}
    for site, labels in zip(rows["site"], rows["labels"], strict=True):
        if label < len(labels) and labels[label].get("bins"):
            out[site] = ScoreBins.from_dict(labels[label]["bins"], where=f"site {site}")
    return out


def with_pooled(bins: dict[str, ScoreBins]) -> dict[str, ScoreBins]:
    """The sites' counts and, with more than one site, their sum as ``pooled``."""
    if len(bins) < 2:
        return dict(bins)
    return {**bins, POOLED: pool(list(bins.values()))}


def card_edge(bins: dict[str, ScoreBins], threshold: float) -> tuple[float, str | None]:
    """The score-bin edge at which the figures for the card's ``threshold`` are computed,
    and, when it is not the threshold itself, a note that says why.

    The counts resolve "score ≥ t" only at their edges below 1. A card threshold of 1.0 is
    what Youden's J gives when no threshold beats chance on the validation scores (a nearly
    untrained model): such a model calls no image positive; the figures are at the highest
    edge the counts resolve."""
    edges = next(iter(bins.values())).edges[:-1]
    edge = float(edges[int(np.argmin(np.abs(edges - threshold)))])
    if abs(edge - threshold) <= EDGE_TOLERANCE:
        return float(threshold), None
    if threshold > edges[-1]:
        return edge, (
            f"The model card's threshold is {threshold:.3f}: Youden's J on the validation "
            "scores found no threshold better than chance (is the model nearly untrained?), "
            f"and at {threshold:.3f} it calls no image positive. The score counts resolve "
            f"thresholds up to {edge:.3f}: the figures below are at {edge:.3f}, which differs "
            f"from {threshold:.3f} only for images scoring {edge:.3f} or more."
        )
    return edge, (
        f"The model card's threshold {threshold:.3f} is not an edge of the stored score "
        f"counts: the figures below are at the nearest edge, {edge:.3f}."
    )


def operating_table(bins: dict[str, ScoreBins], threshold: float) -> pd.DataFrame:
    """One row per site (and pooled): every figure of
    ``fed_auc.metrics.operating_point.figures``."""
    rows = []
    for site, counts in bins.items():
        rows.append({"site": site, **figures(counts, threshold)})
    return pd.DataFrame(rows)


def ci_text(value: Any, lo: Any, hi: Any) -> str:
    """ "0.812 (0.701–0.889)", or "n/a" when undefined."""
    if value is None or pd.isna(value):
        return "n/a"
    return f"{value:.3f} ({lo:.3f}–{hi:.3f})"


def readable(table: pd.DataFrame) -> pd.DataFrame:
    """The columns a clinician reads, each figure with its 95 % CI in one cell."""
    out = pd.DataFrame(
        {
            "site": table["site"],
            "positives": table["n_positive"],
            "negatives": table["n_negative"],
            "TP": table["tp"],
            "FN": table["fn"],
            "TN": table["tn"],
            "FP": table["fp"],
        }
    )
    for name, title in (
        ("sensitivity", "sensitivity"),
        ("specificity", "specificity"),
        ("ppv", "PPV"),
        ("npv", "NPV"),
        ("sensitivity_at_spec_90", "sensitivity @ 90 % spec."),
        ("sensitivity_at_spec_95", "sensitivity @ 95 % spec."),
    ):
        out[f"{title} (95 % CI)"] = [
            ci_text(v, lo, hi)
            for v, lo, hi in zip(table[name], table[f"{name}_lo"], table[f"{name}_hi"], strict=True)
        ]
    out["Brier"] = table["brier"]
    return out


COUNTS = ["positives", "negatives", "TP", "FN", "TN", "FP"]
AT_THRESHOLD = [f"{t} (95 % CI)" for t in ("sensitivity", "specificity", "PPV", "NPV")]
FIXED_SPECIFICITY = [
    "sensitivity @ 90 % spec. (95 % CI)", "sensitivity @ 95 % spec. (95 % CI)", "Brier"
]  # fmt: skip


def readable_parts(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``readable(table)`` as three tables narrow enough to show every column on a laptop:
    the figures at the threshold, the counts behind them, and sensitivity at fixed
    specificity with the Brier score; each keeps the site column."""
    full = readable(table)
    return {
        "at the threshold": full[["site", *AT_THRESHOLD]],
        "counts": full[["site", *COUNTS]],
        "fixed specificity": full[["site", *FIXED_SPECIFICITY]],
    }


def show_operating_tables(table: pd.DataFrame, threshold: float) -> None:
    """The three ``readable_parts`` tables, each under a line that says what it holds."""
    import streamlit as st

    parts = readable_parts(table)
    captions = {
        "at the threshold": f"Sensitivity, specificity, PPV and NPV at threshold "
        f"{threshold:.3f}, with 95 % CIs.",
        "counts": f"Test images per site and what threshold {threshold:.3f} calls them "
        "(TP, FN: positives called positive, negative; TN, FP: negatives called negative, "
        "positive).",
        "fixed specificity": "Sensitivity at 90 % and 95 % specificity (95 % CIs), and the "
        "Brier score.",
    }
    for key, frame in parts.items():
        st.caption(captions[key])
        st.dataframe(
            frame,
            hide_index=True,
            width="stretch",
            column_config={"Brier": st.column_config.NumberColumn(format="%.3f")},
        )


def calibration_frame(bins: dict[str, ScoreBins]) -> pd.DataFrame:
    """Reliability diagram points per site: mean score vs observed positive fraction."""
    rows = []
    for site, counts in bins.items():
        for b in reliability(counts):
            if b.n:
                rows.append(
                    {
                        "site": site,
                        "score range": f"{b.lo:.1f}–{b.hi:.1f}",
                        "mean score": b.mean_score,
                        "observed positive fraction": b.observed.value,
                        "CI low": b.observed.lo,
                        "CI high": b.observed.hi,
                        "images": b.n,
                    }
                )
    return pd.DataFrame(rows)


def roc_frame(bins: dict[str, ScoreBins]) -> pd.DataFrame:
    """The exact ROC curve per site at every bin edge where it moves (each point carries the
    highest threshold that reaches it: the lowest edge of a run of equal points is dropped)."""
    parts = {"site": [], "threshold": [], "sensitivity": [], "fpr": []}
    for site, counts in bins.items():
        if counts.n_positive == 0 or counts.n_negative == 0:
            continue
        thresholds, sensitivity, specificity = curve(counts)
        fpr = 1 - specificity
        moved = np.ones(len(thresholds), dtype=bool)  # only the corners: empty bins add none
        moved[1:] = (np.diff(sensitivity) != 0) | (np.diff(fpr) != 0)
        parts["site"] += [site] * int(moved.sum())
        parts["threshold"].append(thresholds[moved])
        parts["sensitivity"].append(sensitivity[moved])
        parts["fpr"].append(fpr[moved])
    if not parts["site"]:
        return pd.DataFrame()
    return pd.DataFrame({k: v if k == "site" else np.concatenate(v) for k, v in parts.items()})


def point_at(bins: dict[str, ScoreBins], threshold: float) -> pd.DataFrame:
    """Sensitivity and specificity of every site at one threshold (a bin edge)."""
    rows = []
    for site, counts in bins.items():
        op = at_threshold(counts, threshold)
        rows.append(
            {
                "site": site,
                "positives": counts.n_positive,
                "negatives": counts.n_negative,
                "sensitivity": op.sensitivity.value,
                "specificity": op.specificity.value,
                "PPV": op.ppv.value,
                "NPV": op.npv.value,
                "note": ""
                if counts.n_positive and counts.n_negative
                else "one class only: ROC undefined",
            }
        )
    return pd.DataFrame(rows)
