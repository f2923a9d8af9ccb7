"""Overview: how the picked run is going — pooled and worst-site AUC per round."""

import altair as alt
import pandas as pd
import streamlit as st

from app import common
from app.queries import RunData
from app.tables import fmt

SERIES = {
    "global_auc": "pooled test AUC",
    "worst_site_auc": "worst-site AUC",
    "mean_site_auc": "mean site AUC",
}


def body(data: RunData) -> None:
    run, rounds = data.run, data.rounds
    st.title("Overview")
    last, first = rounds.iloc[-1], rounds.iloc[0]
    cols = st.columns(5)
    cols[0].metric("Algorithm", run["algorithm"])
    cols[1].metric("Status", run["status"])
    cols[2].metric("Round", f"{int(last['round'])} / {data.planned_rounds or '?'}")
    delta = None
    if pd.notna(last["global_auc"]) and pd.notna(first["global_auc"]) and len(rounds) > 1:
        delta = f"{last['global_auc'] - first['global_auc']:+.3f} since round 0"
    cols[3].metric("Pooled test AUC", fmt(last["global_auc"]), delta)
    cols[4].metric("Worst-site AUC", fmt(last["worst_site_auc"]))
    if len(rounds) == 1:
        st.info("Only round 0 (the untrained model) is recorded so far.")

    long = rounds.melt("round", list(SERIES), var_name="series", value_name="AUC")
    long["series"] = long["series"].map(SERIES)
    chart = (
        alt.Chart(long.dropna(subset=["AUC"]))
        .mark_line(point=True)
        .encode(
            x=alt.X("round:Q", title="round"),
            y=alt.Y("AUC:Q", scale=alt.Scale(zero=False)),
            color=alt.Color("series:N", title=None),
            tooltip=["round", "series", alt.Tooltip("AUC:Q", format=".3f")],
        )
    )
    st.subheader("AUC per round")
    st.altair_chart(chart, width="stretch")

    sites = data.site_rounds.dropna(subset=["auc"])
    if not sites.empty:
        st.subheader("Test AUC per site")
        per_site = (
            alt.Chart(sites)
            .mark_line()
            .encode(
                x="round:Q",
                y=alt.Y("auc:Q", title="AUC", scale=alt.Scale(zero=False)),
                color="site:N",
                tooltip=["round", "site", alt.Tooltip("auc:Q", format=".3f")],
            )
        )
        st.altair_chart(per_site, width="stretch")

    st.subheader("All runs")
    runs = common.load_runs()
    table = runs[["id", "algorithm", "status", "last_round"]].copy()
    table.insert(3, "started", pd.to_datetime(runs["started_at"], unit="s"))
    st.dataframe(table, hide_index=True, width="stretch")


common.page(body)
