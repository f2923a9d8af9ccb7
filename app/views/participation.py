"""Participation: who took part in each round, who dropped, what it cost in bytes and in
compute (each site's device, images per second and peak memory per round)."""

import altair as alt
import pandas as pd
import streamlit as st

from app import common
from app.charts import constant, heatmap
from app.queries import RunData
from app.tables import STATUSES, bytes_per_round, compute_table, participation, readable

COLORS = ["#2e7d32", "#90caf9", "#e0e0e0", "#f9a825", "#ef6c00", "#c62828", "#9e9e9e"]


def body(data: RunData) -> None:
    st.title("Participation")
    grid = participation(data)
    if grid.empty:
        st.info("No training round recorded yet: only the initial evaluation.")
    else:
        counts = grid["status"].value_counts()
        cols = st.columns(4)
        for col, status in zip(cols, ["completed", "dropped", "rejected", "error"], strict=True):
            col.metric(status.capitalize(), int(counts.get(status, 0)))
        st.subheader("Round × site status")
        heat = heatmap(
            grid,
            "round:O",
            "site:N",
            alt.Color("status:N", scale=alt.Scale(domain=STATUSES, range=COLORS), title="status"),
            ["round", "site", "status", "steps", "trained groups"],
            x_title="round",
        )
        st.altair_chart(heat, width="stretch")
        partial = grid.dropna(subset=["trained groups"])
        if partial.empty:
            st.caption("Every site that trained trained the whole model (no partial training).")
        elif len(partial) == (grid["status"] == "completed").sum() and constant(
            partial, "trained groups"
        ):
            st.caption(
                f"Every site that trained trained {int(partial['trained groups'].iloc[0])} "
                "layer groups in every round: nothing to map."
            )
        else:
            st.subheader("Trained depth (layer groups) of each site")
            depth = heatmap(
                partial,
                "round:O",
                "site:N",
                alt.Color("trained groups:Q", title="layer groups trained"),
                ["round", "site", "trained groups"],
                x_title="round",
            )
            st.altair_chart(depth, width="stretch")
        st.subheader("Per site")
        per_site = grid.pivot_table(
            index="site", columns="status", values="round", aggfunc="count", fill_value=0
        )
        st.dataframe(per_site, width="stretch")

    traffic = bytes_per_round(data)
    if not traffic.empty:
        total = traffic.groupby("direction")["MB"].sum()
        st.subheader(f"Traffic: {total.get('down', 0):.1f} MB down, {total.get('up', 0):.1f} MB up")
        bars = (
            alt.Chart(traffic)
            .mark_bar()
            .encode(
                x=alt.X("round:O", title="round"),
                y=alt.Y("MB:Q", stack=True, title="traffic (MB)"),
                color="direction:N",
                tooltip=["round", "direction", alt.Tooltip("MB:Q", format=".2f")],
            )
        )
        st.altair_chart(bars, width="stretch")

    _events(data)
    _compute(data)


def _events(data: RunData) -> None:
    st.subheader("Events")
    events = data.events
    if events.empty:
        st.caption("No events recorded.")
        return
    levels = st.multiselect(
        "Levels", ["info", "warning", "error"], default=["info", "warning", "error"]
    )
    shown = events[events["level"].isin(levels)].copy()
    shown["time"] = pd.to_datetime(shown["time"], unit="s").dt.strftime("%Y-%m-%d %H:%M:%S")
    st.dataframe(
        shown[["time", "round", "site", "level", "message"]], hide_index=True, width="stretch"
    )


def _compute(data: RunData) -> None:
    """Which site is slow, and why: its device, precision, throughput and peak memory."""
    st.subheader("Compute per site and round")
    table = compute_table(data)
    if table.empty:
        st.caption("No compute recorded: the nodes of this run did not report it.")
        return
    median = table.groupby("site")["images/s"].median().sort_values()
    slowest = median.index[0]
    devices = table.groupby("site")["device"].last()
    st.caption(
        f"Slowest site: {slowest} ({median.iloc[0]:.1f} images/s median, on "
        f"{devices[slowest]}); fastest: {median.index[-1]} ({median.iloc[-1]:.1f} images/s)."
    )
    line = (
        alt.Chart(table)
        .mark_line(point=True)
        .encode(
            x=alt.X("round:O", title="round"),
            y=alt.Y("images/s:Q", title="images per second"),
            color="site:N",
            tooltip=list(table.columns),
        )
    )
    st.altair_chart(line, width="stretch")
    digits = {"round": 0, "site": None, "device": None, "precision": None, "images/s": 1,
              "host peak MiB": 0, "device peak MiB": 0}  # fmt: skip
    st.dataframe(readable(table, digits), hide_index=True, width="stretch")  # "—": not CUDA


common.page(body)
