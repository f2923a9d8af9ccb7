"""Heterogeneity: how different are the sites — data, updates, local work."""

import altair as alt
import pandas as pd
import streamlit as st

from app import common
from app.charts import constant, heatmap
from app.queries import RunData
from app.tables import heterogeneity_table, readable_cards, similarity


def _line(frame: pd.DataFrame, column: str, title: str) -> alt.Chart:
    return (
        alt.Chart(frame.dropna(subset=[column]))
        .mark_line(point=True)
        .encode(
            x=alt.X("round:Q", title="round"),
            y=alt.Y(f"{column}:Q", title=title),
            color="site:N",
            tooltip=["round", "site", alt.Tooltip(f"{column}:Q", format=".3f")],
        )
    )


def body(data: RunData) -> None:
    st.title("Heterogeneity")
    st.subheader("Data per site")
    table = heterogeneity_table(data)
    if table.empty and data.sites.empty:
        st.info("No data cards recorded for this run.")
    else:
        st.dataframe(readable_cards(table), width="stretch")
        if not any("intensity" in c for c in table.columns):
            st.caption("No intensity statistics in this run's data cards.")
        else:
            st.caption("mean, SD: the pixel intensities' mean and standard deviation per split.")
        with st.expander("Full data-card summaries"):
            st.json({s: c for s, c in zip(data.sites["site"], data.sites["summary"], strict=True)})

    matrix = similarity(table)
    if not matrix.empty:
        st.subheader("Site × site similarity")
        st.caption(
            "1 / (1 + d), d = RMS distance between the sites' z-scored prevalence and intensity "
            "statistics above: 1 = alike, towards 0 = far apart."
        )
        long = matrix.rename_axis("site").reset_index()
        long = long.melt("site", var_name="other site", value_name="similarity")
        heat = heatmap(
            long,
            "other site:N",
            "site:N",
            alt.Color(
                "similarity:Q",
                scale=alt.Scale(domain=[0, 1]),
                title="similarity (1 = alike)",
            ),
            ["site", "other site", alt.Tooltip("similarity:Q", format=".2f")],
            x_title="other site",
            square=True,
        )
        st.altair_chart(heat, width="content")

    trained = data.site_rounds[data.site_rounds["round"] > 0]
    if trained["drift"].notna().any():
        st.subheader("Update drift and cosine to the mean update")
        cols = st.columns(2)
        drift_title = "‖Δw_k − mean Δw‖ (L2, weight units)"
        cols[0].altair_chart(_line(trained, "drift", drift_title), width="stretch")
        cols[1].altair_chart(
            _line(trained, "cosine", "cos(Δw_k, mean Δw) (unitless)"), width="stretch"
        )
    elif (data.run["config"] or {}).get("secure_aggregation"):
        st.info(
            "Update drift and cosine are unavailable for this run: under secure aggregation "
            "the coordinator sees only the sum of the sites' updates, never one site's."
        )
    else:
        st.info("No update signals recorded yet (no trained round).")
    steps = trained.dropna(subset=["steps"])
    if not steps.empty:
        st.subheader("Local steps per site")
        summary = steps.groupby("site")["steps"].agg(["count", "sum", "mean", "min", "max"])
        summary.columns = ["rounds trained", "total steps", "mean", "min", "max"]
        st.dataframe(summary, width="stretch")
        if constant(steps, "steps"):
            st.caption(
                f"Every site ran {int(steps['steps'].iloc[0])} local steps in every round it "
                "trained: nothing to map."
            )
            return
        heat = heatmap(
            steps,
            "round:O",
            "site:N",
            alt.Color("steps:Q", title="local steps (optimizer steps)"),
            ["round", "site", "steps"],
            x_title="round",
        )
        st.altair_chart(heat, width="stretch")


common.page(body)
