"""Compare: two or more runs side by side — AUC per round and AUC per MB sent."""

import altair as alt
import pandas as pd
import streamlit as st

from app import common
from app.queries import RunData


def body(data: RunData) -> None:
    st.title("Compare runs")
    runs = common.load_runs()
    labels = dict(zip(runs["id"], runs["label"], strict=True))
    if len(labels) < 2:
        st.info("Only one run in this store: start another (e.g. another --algorithm) to compare.")
    default = list(labels)[:3] if data.run["id"] in list(labels)[:3] else [data.run["id"]]
    picked = st.multiselect(
        "Runs", list(labels), default=default, format_func=labels.get, key="compare_runs"
    )
    if not picked:
        st.info("Pick at least one run.")
        return
    frames = []
    for run_id in picked:
        run = common.load_run(run_id)
        rounds = run.rounds[["round", "global_auc", "worst_site_auc", "cumulative_mb"]].copy()
        rounds["run"] = f"{run.run['algorithm']} · {run_id}"
        frames.append(rounds)
    table = pd.concat(frames, ignore_index=True)
    final = table.groupby("run", sort=False).last()
    final.columns = ["last round", "pooled test AUC", "worst-site AUC", "total MB"]
    st.dataframe(
        final,
        width="stretch",
        column_config={c: st.column_config.NumberColumn(format="%.3f") for c in final.columns[1:]},
    )
    metric = st.radio(
        "AUC",
        ["global_auc", "worst_site_auc"],
        horizontal=True,
        format_func={"global_auc": "pooled test", "worst_site_auc": "worst site"}.get,
    )
    cols = st.columns(2)
    for col, x, title in (
        (cols[0], "round", "round"),
        (cols[1], "cumulative_mb", "MB sent (down + up, cumulative)"),
    ):
        chart = (
            alt.Chart(table.dropna(subset=[metric]))
            .mark_line(point=True)
            .encode(
                x=alt.X(f"{x}:Q", title=title),
                y=alt.Y(f"{metric}:Q", title="AUC", scale=alt.Scale(zero=False)),
                color=alt.Color("run:N", legend=alt.Legend(orient="bottom", columns=1)),
                tooltip=[
                    "run",
                    "round",
                    alt.Tooltip(f"{metric}:Q", format=".3f"),
                    alt.Tooltip("cumulative_mb:Q", format=".1f"),
                ],
            )
        )
        col.altair_chart(chart, width="stretch")


common.page(body)
