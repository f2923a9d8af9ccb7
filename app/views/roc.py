"""ROC: per-site ROC curves and the operating point a clinician picks. The exported model's
curves are exact at every score-bin edge; the threshold starts at the model card's and can be
set from a target specificity. The last round's stored curves are the second view."""

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from app import common
from app.clinical import POOLED, card_edge, exported_bins, point_at, roc_frame, with_pooled
from app.model_view import EXPORTED, choices
from app.queries import RunData
from app.tables import class_short, label_names, roc_curves
from fed_auc.metrics.operating_point import sensitivity_at_specificity
from fed_auc.metrics.roc import operating_point

THRESHOLD_KEY = "roc_threshold"
TARGET_KEY = "roc_target_specificity"


def body(data: RunData) -> None:
    st.title("ROC")
    names = label_names(data)
    label = 0
    if len(names) > 1:
        label = st.selectbox("Finding", range(len(names)), format_func=names.__getitem__)
    options = choices(data)
    titles = [c.title for c in options]
    choice = options[titles.index(st.radio("Model", titles, horizontal=True, key="roc_model"))]
    card = choice.thresholds[label] if label < len(choice.thresholds) else 0.5
    if choice.key == EXPORTED:
        bins = exported_bins(data, label)
        if bins:
            exported_view(data, choice, with_pooled(bins), card)
            return
        st.info(
            "This run stores no score counts of its exported model (recorded from this version "
            "on); showing the stored curves of the exported round instead."
        )
    round_view(data, choice, label, card)


def _set_from_target(bins, edges: list[float]) -> None:
    """Callback: move the threshold to where the pooled specificity reaches the target."""
    point = sensitivity_at_specificity(bins, st.session_state[TARGET_KEY])
    if point is not None:
        st.session_state[THRESHOLD_KEY] = point.threshold


def exported_view(data: RunData, choice, bins: dict, card: float) -> None:
    reference = bins.get(POOLED) or next(iter(bins.values()))
    edges = [float(e) for e in reference.edges[:-1]]
    _, note = card_edge(bins, card)
    if note:
        st.warning(note.replace("the figures below are", "the slider starts"))
    if st.session_state.get(THRESHOLD_KEY) not in edges:
        st.session_state[THRESHOLD_KEY] = min(edges, key=lambda e: abs(e - card))
    cols = st.columns([3, 1])
    threshold = cols[0].select_slider(
        "Operating threshold (positive if score ≥ threshold)",
        options=edges,
        format_func=lambda e: f"{e:.3f}",
        key=THRESHOLD_KEY,
    )
    cols[1].number_input(
        "Target specificity (pooled)",
        min_value=0.5,
        max_value=0.999,
        value=0.9,
        step=0.01,
        key=TARGET_KEY,
    )
    cols[1].button(
        "Set threshold", on_click=_set_from_target, args=(reference, edges), key="roc_set"
    )
    st.caption(
        f"{choice.caption}. Starts at the model card's threshold {card:.3f} "
        f"({choice.threshold_note}); figures are exact at every score-bin edge (0.001 apart)."
    )
    table = point_at(bins, threshold)
    st.subheader(f"At threshold {threshold:.3f}")
    _table(table)
    curves = roc_frame(bins)
    if curves.empty:
        return
    points = table.dropna(subset=["sensitivity", "specificity"]).assign(
        fpr=lambda t: 1 - t["specificity"]
    )
    _chart(curves, points, common.positive_class_text(data))


def round_view(data: RunData, choice, label: int, card: float) -> None:
    curves = roc_curves(common.load_roc_points(data.run["id"], choice.round), label)
    if not curves:
        st.info("This run stores no ROC points for that round (recorded from this version on).")
        return
    start = float(np.round(card, 2))
    if st.session_state.get("roc_round_threshold") is None:
        st.session_state["roc_round_threshold"] = start
    threshold = st.slider(
        "Operating threshold (positive if score ≥ threshold)",
        0.0,
        1.0,
        step=0.01,
        key="roc_round_threshold",
    )
    st.caption(
        f"{choice.caption}. Starts at the model card's threshold {card:.3f} rounded to 0.01 "
        "(the stored curve has ≤ 101 points; between them the values are interpolated)."
    )
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
                }  # fmt: skip
            )
            continue
        rows.append({"site": site, "sensitivity": op[0], "specificity": op[1], "note": ""})
        points.append({"site": site, "fpr": 1 - op[1], "sensitivity": op[0]})
    st.subheader(f"At threshold {threshold:.2f}")
    _table(pd.DataFrame(rows))
    long = pd.DataFrame(
        [
            {"site": site, "fpr": f, "sensitivity": t, "threshold": h}
            for site, roc in curves.items()
            for f, t, h in zip(roc["fpr"], roc["tpr"], roc["thresholds"], strict=True)
        ]
    )
    if not long.empty:
        _chart(long, pd.DataFrame(points), common.positive_class_text(data))


def _table(table: pd.DataFrame) -> None:
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            c: st.column_config.NumberColumn(format="%.3f")
            for c in ("sensitivity", "specificity", "PPV", "NPV")
            if c in table
        },
    )


def _chart(curves: pd.DataFrame, points: pd.DataFrame, positive: str) -> None:
    """ROC curves whose axes name the positive class (a cropped screenshot still says it)."""
    lines = (
        alt.Chart(curves)
        .mark_line()
        .encode(
            x=alt.X("fpr:Q", title="1 − specificity (false-positive rate)"),
            y=alt.Y(
                "sensitivity:Q",
                title=f"sensitivity (true-positive rate), positive class {class_short(positive)}",
            ),
            color="site:N",
            order=alt.Order("threshold:Q", sort="descending"),  # along the curve
            tooltip=["site", alt.Tooltip("threshold:Q", format=".3f")],
        )
    )
    diagonal = (
        alt.Chart(pd.DataFrame({"x": [0, 1], "y": [0, 1]}))
        .mark_line(strokeDash=[4, 4], color="gray")
        .encode(x="x:Q", y="y:Q")
    )
    layers = lines + diagonal
    if not points.empty:
        layers += (
            alt.Chart(points)
            .mark_point(size=120, filled=True)
            .encode(x="fpr:Q", y="sensitivity:Q", color="site:N")
        )
    st.altair_chart(layers, width="stretch")


common.page(body)
