"""The tables the pages show, derived from one run's rows. Pure pandas, no Streamlit.

Each function says what a reader of the page gets, so tests can recompute the same numbers
from the store and compare.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from app.queries import RunData

UNDEFINED = "AUC undefined"
STATUSES = ["completed", "selected", "idle", "dropped", "rejected", "error", "initial"]


def label_names(data: RunData) -> list[str]:
    """Label names from the data cards, or label_0… from the number of labels in the config."""
    for summary in data.sites["summary"]:
        if isinstance(summary, dict) and summary.get("label_names"):
            return list(summary["label_names"])
    return [f"label_{i}" for i in range(int((data.run["config"] or {}).get("num_labels", 1)))]


def evaluated_rounds(data: RunData) -> list[int]:
    """Rounds where at least one site has a test AUC or an undefined-AUC note."""
    rows = data.site_rounds
    has_eval = rows["n_test"].notna()
    return sorted(rows.loc[has_eval, "round"].unique().tolist())


def _prevalence(positives: Any, n: Any, label: int) -> float | None:
    if not isinstance(positives, list) or label >= len(positives) or not n:
        return None
    return positives[label] / n


def site_table(data: RunData, round_: int) -> pd.DataFrame:
    """Per site at one round: AUC with 95 % CI, counts, prevalence, last round it trained."""
    rows = data.site_rounds
    at = rows[rows["round"] == round_].set_index("site")
    trained = rows[rows["status"] == "completed"].groupby("site")["round"].max()
    names = label_names(data)
    out = []
    for site, row in at.iterrows():
        metrics = row["metrics"] or {}
        undefined = "; ".join(metrics.get("undefined") or [])
        entry = {
            "site": site,
            "AUC": row["auc"],
            "CI low": row["auc_lo"],
            "CI high": row["auc_hi"],
            "note": undefined or ("" if pd.notna(row["auc"]) else UNDEFINED),
            "n test": row["n_test"],
            "n train": _train_n(data, site, row),
        }
        for j, name in enumerate(names):
            key = "prevalence" if len(names) == 1 else f"prevalence ({name})"
            entry[key] = _prevalence(row["test_positives"], row["n_test"], j)
        entry["personal AUC"] = row["personal_auc"]
        entry["last round trained"] = trained.get(site)
        out.append(entry)
    table = pd.DataFrame(out)
    if table.empty or table["personal AUC"].isna().all():
        table = table.drop(columns=["personal AUC"], errors="ignore")
    return table


def _train_n(data: RunData, site: str, row: pd.Series) -> float | None:
    if pd.notna(row["n"]):
        return row["n"]
    card = data_cards(data)
    if "train.n" in card and site in card.index:
        return card.loc[site, "train.n"]
    return None


def data_cards(data: RunData) -> pd.DataFrame:
    """The sites table's summaries flattened to dotted columns (train.intensity_mean, …)."""
    summaries = [s if isinstance(s, dict) else {} for s in data.sites["summary"]]
    if not summaries:
        return pd.DataFrame()
    flat = pd.json_normalize(summaries)
    flat.index = data.sites["site"].tolist()
    flat.index.name = "site"
    return flat


def heterogeneity_table(data: RunData) -> pd.DataFrame:
    """Per site: train prevalence per label and intensity mean/std per split, where present."""
    cards = data_cards(data)
    out = pd.DataFrame(index=cards.index)
    names = label_names(data)
    if {"train.n", "train.positives"} <= set(cards.columns):
        for j, name in enumerate(names):
            key = "prevalence" if len(names) == 1 else f"prevalence ({name})"
            out[key] = [
                _prevalence(p, n, j)
                for p, n in zip(cards["train.positives"], cards["train.n"], strict=True)
            ]
    for split in ("train", "val", "test"):
        for stat in ("intensity_mean", "intensity_std"):
            column = f"{split}.{stat}"
            if column in cards:
                out[f"{split} {stat.replace('_', ' ')}"] = cards[column]
    return out


def readable_cards(table: pd.DataFrame) -> pd.DataFrame:
    """``heterogeneity_table`` as read, every column in view at 1280 px: short headers
    (``train mean``, ``test SD``), 3 decimals, "—" where a card has no value."""
    short = {c: c.replace(" intensity mean", " mean").replace(" intensity std", " SD")
             for c in table.columns}  # fmt: skip
    return readable(table, {}).rename(columns=short)


def similarity(features: pd.DataFrame) -> pd.DataFrame:
    """Site × site similarity 1 / (1 + d) with d the RMS distance of z-scored features.

    Features that do not vary across sites carry no information and are dropped; 1 on the
    diagonal, towards 0 for sites far apart in prevalence and intensity.
    """
    numeric = features.apply(pd.to_numeric, errors="coerce").dropna(axis=1, how="any")
    spread = numeric.std(ddof=0)
    z = (numeric.loc[:, spread > 0] - numeric.mean()) / spread
    z = z.dropna(axis=1)
    if z.shape[1] == 0:
        return pd.DataFrame()
    diff = z.values[:, None, :] - z.values[None, :, :]
    distance = np.sqrt((diff**2).mean(axis=2))
    return pd.DataFrame(1 / (1 + distance), index=z.index, columns=z.index)


def participation(data: RunData) -> pd.DataFrame:
    """Round × site status with the number of trained layer groups (None = whole model)."""
    rows = data.site_rounds[data.site_rounds["round"] > 0]
    groups = rows["trained_groups"].map(lambda g: len(g) if isinstance(g, list) else None)
    return pd.DataFrame(
        {
            "round": rows["round"],
            "site": rows["site"],
            "status": rows["status"],
            "trained groups": groups,
            "steps": rows["steps"],
        }
    )


COMPUTE_COLUMNS = {
    "device": "device", "precision": "precision", "images_per_s": "images/s",
    "host_peak_mib": "host peak MiB", "device_peak_mib": "device peak MiB",
}  # fmt: skip


def compute_table(data: RunData) -> pd.DataFrame:
    """Per site and round, where it trained and what it cost: device, precision, images per
    second, peak host memory and (on CUDA) peak device memory, as the node measured them."""
    records = []
    for row in data.site_rounds.itertuples():
        compute = row.metrics.get("compute") if isinstance(row.metrics, dict) else None
        if compute:
            shown = {name: compute.get(key) for key, name in COMPUTE_COLUMNS.items()}
            records.append({"round": row.round, "site": row.site, **shown})
    return pd.DataFrame(records, columns=["round", "site", *COMPUTE_COLUMNS.values()])


def bytes_per_round(data: RunData) -> pd.DataFrame:
    """MB down and up per round (long format for a stacked bar chart)."""
    rounds = data.rounds[data.rounds["round"] > 0]
    frame = pd.DataFrame(
        {
            "round": rounds["round"],
            "down": rounds["bytes_down"].fillna(0) / 1e6,
            "up": rounds["bytes_up"].fillna(0) / 1e6,
        }
    )
    return frame.melt("round", var_name="direction", value_name="MB")


def roc_curves(rocs: dict[str, list[dict[str, Any]]], label: int) -> dict[str, dict[str, Any]]:
    """Per site, the stored ROC points of one label (from ``queries.roc_points``)."""
    return {site: roc[label] for site, roc in rocs.items() if label < len(roc)}


MISSING = "—"  # a table cell with no value (never "None", never blank)


def cell(value: Any, digits: int | None = 3) -> Any:
    """A table cell as read: a number at ``digits`` decimals (None: as it is), yes/no for a
    flag, ``MISSING`` for None/NaN (one precision per quantity: 3 decimals for every AUC,
    bound and prevalence)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return MISSING
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if digits is not None and isinstance(value, int | float | np.integer | np.floating):
        return f"{value:.{digits}f}"
    return value if value != "" else MISSING


def readable(frame: pd.DataFrame, digits: dict[str, int | None]) -> pd.DataFrame:
    """``frame`` with each cell as ``cell`` writes it: ``digits`` per column (3 if unnamed;
    None keeps the value, for text and counts). Text cells, so a missing value reads "—"."""
    out = frame.copy()
    for column in out.columns:
        places = digits.get(column, 3)
        out[column] = [cell(v, places) for v in out[column]]
        if places is None:
            out[column] = out[column].astype(str)
    return out


def class_short(positive_class: str) -> str:
    """The positive class for a header or an axis: its name, or "label 1" where the run's
    cards did not name it (``queries.positive_class``)."""
    return "label 1" if positive_class.startswith("not recorded") else positive_class


def auc_header(positive_class: str, what: str = "AUC") -> str:
    """``AUC (malignant)``: a column or axis of AUCs says which class is positive, so that a
    cropped screenshot still does."""
    return f"{what} ({class_short(positive_class)})"


def ci_header(method: str) -> str:
    """``95 % CI (bootstrap)``: an interval column names the method that made it."""
    return f"95 % CI ({method})"


def fmt(value: Any, digits: int = 3) -> str:
    """A number for a metric card, or "n/a" for None/NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


# Tableau 10: ten hues that stay apart (no two similar blues), in a fixed order per pick.
PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac"]  # fmt: skip


def compare_table(
    rounds: pd.DataFrame, exported: dict[str, float | None], classes: dict[str, str]
) -> pd.DataFrame:
    """Per compared run (``rounds``: their rounds, a ``run`` column naming each): its positive
    class, the exported model's pooled test AUC, the last round's pooled and worst-site AUC
    and the MB sent, with headers short enough for every column to stay in view at 1280 px."""
    final = rounds.groupby("run", sort=False).last()
    out = pd.DataFrame(index=final.index.map(lambda r: r.split(" · ")[-1]).rename("run"))
    out["positive class"] = [class_short(classes[r]) for r in final.index]
    out["exported AUC"] = [exported[r] for r in final.index]
    out["last round"] = final["round"].to_numpy()
    out["last round: pooled AUC"] = final["global_auc"].to_numpy()
    out["last round: worst site"] = final["worst_site_auc"].to_numpy()
    out["MB sent"] = final["cumulative_mb"].to_numpy()
    return readable(out, {"positive class": None, "last round": 0, "MB sent": 1})


def differing_settings(configs: dict[str, dict]) -> pd.DataFrame:
    """Config keys whose values differ between the runs (one column per run)."""
    keys = sorted(set().union(*(c.keys() for c in configs.values())))
    rows = {}
    for key in keys:
        values = {run: (c or {}).get(key) for run, c in configs.items()}
        if len({repr(v) for v in values.values()}) > 1:
            rows[key] = {run: "–" if v is None else str(v) for run, v in values.items()}
    return pd.DataFrame.from_dict(rows, orient="index")


FINAL_AUC = "AUC"


def runs_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Every run, as read: what tells runs apart, its AUC with what that AUC is (the figure
    the run picker shows) and its positive class (in the AUC header when every run has the
    same); "—" where there is none. Narrow enough to stay in view at 1280 px."""
    classes = runs["positive_class"].map(class_short)
    one = len(set(classes)) == 1
    auc = auc_header(classes.iloc[0]) if one and len(classes) else FINAL_AUC
    table = pd.DataFrame(
        {
            "id": runs["id"],
            "algorithm": runs["algorithm"],
            "data": [  # "synthetic" in the data column, not a column of its own
                f"{source} (synthetic)" if synthetic and source != "synthetic" else source
                for source, synthetic in zip(runs["data_source"], runs["synthetic"], strict=True)
            ],
            "transport": runs["transport"],
            "sites": runs["n_sites"],
            "status": runs["status"],
            "rounds": runs["last_round"],  # the start: in the id, the picker's label
            auc: [
                MISSING if auc is None or auc != auc else f"{auc:.3f} ({of})"
                for auc, of in zip(runs["final_auc"], runs["auc_of"], strict=True)
            ],
        }
    )
    if not one:
        table["positive class"] = classes
    return readable(table, dict.fromkeys(table.columns) | {"sites": 0, "rounds": 0})


def paired_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One recorded comparison (``fed-auc runs --compare``) as read, a row per site (pooled
    last) and label: both AUCs, A − B signed with its paired interval, p, and what it is on."""
    many = rows["label"].nunique() > 1
    out = pd.DataFrame(index=rows["site"].rename("site"))
    if many:
        out["label"] = rows["label"].to_numpy()
    out["AUC A"] = rows["auc_a"].to_numpy()
    out["AUC B"] = rows["auc_b"].to_numpy()
    out["A − B"] = [MISSING if _missing(d) else f"{d:+.3f}" for d in rows["difference"]]
    level = rows["level"].iloc[0] if len(rows) else 0.95
    method = rows["method"].iloc[0] if len(rows) else "DeLong"
    interval = f"{100 * level:g} % CI ({method}, paired)"
    out[interval] = [
        MISSING if _missing(lo) or _missing(hi) else f"{lo:+.3f} to {hi:+.3f}"
        for lo, hi in zip(rows["lo"], rows["hi"], strict=True)
    ]
    out["p"] = rows["p_value"].to_numpy()
    out["test images"] = rows["n"].to_numpy()
    out["positives"] = rows["positives"].to_numpy()
    out["note"] = rows["reason"].fillna("").to_numpy()
    text = ("label", "A − B", interval, "test images", "positives", "note")
    return readable(out, dict.fromkeys(text))


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
