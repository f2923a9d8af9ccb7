"""ROC: per-site ROC curves of the latest evaluation, and the operating point a clinician picks."""

import altair as alt
import pandas as pd
import streamlit as st

from app import common
from app.queries import RunData
from app.tables import label_names, roc_curves, roc_round
from fed_auc.roc import operating_point

DEFAULT_THRESHOLD = 0.5


def body(data: RunData) -> None:
    st.title("ROC")
    round_ = roc_round(data)
    if round_ is None:
        st.info("This run stores no ROC points (recorded from this version on).")
        return
    names = label_names(data)
    label = 0
    if len(names) > 1:
        label = st.selectbox("Finding", range(len(names)), format_func=names.__getitem__)
    curves = roc_curves(data, round_, label)
    threshold = st.slider(
        "Operating threshold (positive if score ≥ threshold)",
        0.0,
        1.0,
        DEFAULT_THRESHOLD,
        0.01,
        key="roc_threshold",
    )
    st.caption(f"Global model after round {round_}, each site's test split.")
    rows, points = [], []
    for site, roc in curves.items():
        op = operating_point(roc, threshold)
        if op is None:
            rows.append(
                {
                    "site": site,
                    "sensitivity": None,
                    "specificity": None,
                    "note": f"ROC undefined: {roc.get('reason', 'one class only')}",
                }
            )
            continue
        rows.append({"site": site, "sensitivity": op[0], "specificity": op[1], "note": ""})
        points.append({"site": site, "fpr": 1 - op[1], "tpr": op[0]})
    table = pd.DataFrame(rows)
    st.subheader(f"At threshold {threshold:.2f}")
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            c: st.column_config.NumberColumn(format="%.3f") for c in ("sensitivity", "specificity")
        },
    )
    long = pd.DataFrame(
        [
            {"site": site, "fpr": f, "tpr": t, "threshold": h}
            for site, roc in curves.items()
            for f, t, h in zip(roc["fpr"], roc["tpr"], roc["thresholds"], strict=True)
        ]
    )
    if long.empty:
        return
    lines = (
        alt.Chart(long)
        .mark_line()
        .encode(
            x=alt.X("fpr:Q", title="1 − specificity"),
            y=alt.Y("tpr:Q", title="sensitivity"),
            color="site:N",
            order="fpr:Q",
            tooltip=["site", alt.Tooltip("threshold:Q", format=".3f")],
        )
    )
    diagonal = (
        alt.Chart(pd.DataFrame({"x": [0, 1], "y": [0, 1]}))
        .mark_line(strokeDash=[4, 4], color="gray")
        .encode(x="x:Q", y="y:Q")
    )
    dots = (
        alt.Chart(pd.DataFrame(points))
        .mark_point(size=120, filled=True)
        .encode(x="fpr:Q", y="tpr:Q", color="site:N")
    )
    st.altair_chart(lines + diagonal + dots, width="stretch")


common.page(body)
