"""Overview: the model the run exported (headline), the last round beside it, AUC per round
with the number of sites each round's figures cover, and every run of the store."""

import altair as alt
import pandas as pd
import streamlit as st

from app import common
from app.clinical import exported_bins, with_pooled
from app.model_view import EXPORTED, choices, coverage, scored_per_round, site_status
from app.queries import EXPORTED_AUC, RunData
from app.tables import FINAL_AUC, auc_header, fmt, runs_table
from fed_auc.metrics.operating_point import auc_from_bins
from fed_auc.metrics.wording import interval_text

ROUND_AXIS = alt.Axis(format="d", tickMinStep=1)
SERIES = {
    "global_auc": "pooled test AUC",
    "worst_site_auc": "worst-site AUC",
    "mean_site_auc": "mean site AUC",
}


def headline(data: RunData) -> None:
    """One row of figures per model: the exported one first, then the last round."""
    for choice in choices(data):
        table = site_status(data, choice)
        cover = coverage(table)
        pooled = _pooled_auc(data, choice)
        st.subheader(choice.title)
        cols = st.columns(4)
        prefix = "Exported" if choice.key == EXPORTED else "Last round"
        cols[0].metric(f"{prefix}: pooled test AUC", fmt(pooled))
        cols[1].metric(f"{prefix}: mean site AUC", fmt(cover.mean_auc))
        cols[2].metric(f"{prefix}: worst-site AUC", fmt(cover.worst_auc))
        cols[3].metric(f"{prefix}: sites scored", f"{len(cover.scored)} of {cover.total}")
        st.caption(describe(choice, table, cover))


def describe(choice, table: pd.DataFrame, cover) -> str:
    """Which sites the figures cover, the worst site's counts, and who is missing."""
    parts = [f"{choice.caption}; pooled, mean and worst over {cover.sentence()}; {choice.ci_text}"]
    if cover.worst_site is not None:
        worst = table.set_index("site").loc[cover.worst_site]
        ci = (
            f", 95 % CI {interval_text(worst['CI low'], worst['CI high'])} ({choice.ci_method})"
            if pd.notna(worst["CI low"])
            else ""
        )
        few = " — few cases, mostly noise" if worst["few cases"] else ""
        parts.append(
            f"worst site {cover.worst_site}: {cover.worst_auc:.3f}{ci} "
            f"({int(worst['positives'])} positives, {int(worst['negatives'])} negatives){few}"
        )
    for site in cover.missing:
        note = table.set_index("site").loc[site, "note"]
        parts.append(f"{site} {note}")
    return ". ".join(parts) + "."


def _pooled_auc(data: RunData, choice) -> float | None:
    """Exported: its model card's pooled test AUC, the figure the run picker, All runs and
    ``fed-auc runs`` show (the sites' binned counts only where the card has none: scores that
    never left the sites); a round: the coordinator's pooled AUC."""
    if choice.key == EXPORTED:
        if data.run["auc_of"] == EXPORTED_AUC and data.run["final_auc"] is not None:
            return data.run["final_auc"]
        bins = with_pooled(exported_bins(data, 0))
        return auc_from_bins(bins.get("pooled") or next(iter(bins.values()))) if bins else None
    row = data.rounds[data.rounds["round"] == choice.round]
    return None if row.empty else row["global_auc"].iloc[0]


def body(data: RunData) -> None:
    run, rounds = data.run, data.rounds
    st.title("Overview")
    cols = st.columns(3)
    cols[0].metric("Algorithm", run["algorithm"])
    cols[1].metric("Status", run["status"])
    cols[2].metric("Round", f"{int(rounds['round'].max())} / {data.planned_rounds or '?'}")
    stopped = (run.get("summary") or {}).get("stopped")
    if stopped:
        st.caption(f"Stopped early after round {stopped['round']}: {stopped['reason']}")
    headline(data)
    if len(rounds) == 1:
        st.info("Only round 0 (the untrained model) is recorded so far.")

    scored = scored_per_round(data)
    positive_auc = auc_header(common.positive_class_text(data))
    long = rounds.melt("round", list(SERIES), var_name="series", value_name="AUC")
    long["series"] = long["series"].map(SERIES)
    long = long.merge(scored, on="round", how="left")
    long["sites scored"] = (
        long["scored"].astype("Int64").astype(str) + " of " + long["sites"].astype(str)
    )
    chart = (
        alt.Chart(long.dropna(subset=["AUC"]))
        .mark_line(point=True)
        .encode(
            x=alt.X("round:Q", title="round", axis=ROUND_AXIS),
            y=alt.Y("AUC:Q", title=f"test {positive_auc}", scale=alt.Scale(zero=False)),
            color=alt.Color("series:N", title=None),
            tooltip=["round", "series", alt.Tooltip("AUC:Q", format=".3f"), "sites scored"],
        )
    )
    st.subheader("AUC per round (global model after each round)")
    fewer = scored[scored["scored"] < scored["sites"]]
    if not fewer.empty:
        st.warning(
            f"In {len(fewer)} evaluated round(s) not every site was scored (rounds "
            f"{_ranges(fewer['round'].tolist())}): pooled, mean and worst-site AUC there cover "
            "only the sites scored; see the tooltip and the Sites page."
        )
    st.altair_chart(chart, width="stretch")

    evaluated = data.site_rounds["round"].isin(scored["round"])
    sites = data.site_rounds.loc[evaluated, ["round", "site", "auc"]]  # NaN: not scored
    if sites["auc"].notna().any():
        st.subheader("Test AUC per site (global model after each round)")
        st.caption("A gap in a site's line: rounds it was not scored (or had one class).")
        per_site = (
            alt.Chart(sites)
            .mark_line(point=len(sites["round"].unique()) < 40, invalid="break-paths-show-domains")
            .encode(
                x=alt.X("round:Q", title="round", axis=ROUND_AXIS),
                y=alt.Y("auc:Q", title=f"test {positive_auc}", scale=alt.Scale(zero=False)),
                color=alt.Color(
                    "site:N", legend=alt.Legend(columns=2 if data.sites.shape[0] > 16 else 1)
                ),
                tooltip=["round", "site", alt.Tooltip("auc:Q", format=".3f")],
            )
        )
        st.altair_chart(per_site, width="stretch")

    st.subheader("All runs")
    table = runs_table(common.load_runs())
    st.caption(
        f"{FINAL_AUC}: (export) the exported model's pooled test AUC, its model card's; (last "
        "round) the last round's; (evaluation) an `evaluate` run's pooled test AUC. Each is "
        "about its run's positive class."
    )
    st.dataframe(table, hide_index=True, width="stretch")  # every column in view on a laptop


def _ranges(rounds: list[int]) -> str:
    """[4, 5, 6, 9] → "4–6, 9"."""
    out, start = [], None
    for i, r in enumerate(rounds):
        if start is None:
            start = r
        if i + 1 == len(rounds) or rounds[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}–{r}")
            start = None
    return ", ".join(out)


common.page(body)
