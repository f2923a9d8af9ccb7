"""Operating point: what a clinician reads about the exported model at its threshold, per site
and pooled: counts, sensitivity / specificity / PPV / NPV with 95 % CIs, sensitivity at 90 %
and 95 % specificity, and calibration (reliability diagram, Brier score)."""

import altair as alt
import pandas as pd
import streamlit as st

from app import common
from app.clinical import (
    calibration_frame,
    card_edge,
    exported_bins,
    operating_table,
    show_operating_tables,
    with_pooled,
)
from app.model_view import EXPORTED, choices
from app.queries import RunData
from app.tables import class_short, label_names


def body(data: RunData) -> None:
    st.title("Operating point")
    exported = [c for c in choices(data) if c.key == EXPORTED]
    if not exported:
        st.info("The run has not exported a model yet: operating points describe the export.")
        return
    choice = exported[0]
    names = label_names(data)
    label = 0
    if len(names) > 1:
        label = st.selectbox("Finding", range(len(names)), format_func=names.__getitem__)
    bins = exported_bins(data, label)
    if not bins:
        st.info(
            "This run stores no score counts of its exported model (recorded from this version "
            "on): run `fed-auc evaluate` on the model, or train the run again."
        )
        return
    card = choice.thresholds[label] if label < len(choice.thresholds) else 0.5
    threshold, note = card_edge(bins, card)
    if note:
        st.warning(note)
    table = operating_table(with_pooled(bins), threshold)
    st.caption(
        f"{choice.caption}; pooled = all {len(bins)} scored sites' test images together. "
        f"Positive class: {common.positive_class_text(data)}: sensitivity is the share of its "
        "images called positive, specificity the share of the others called negative. "
        f"The model card's threshold {card:.3f} ({choice.threshold_note}); positive if "
        "score ≥ threshold. "
        "95 % CIs: Wilson score intervals. Sensitivity at 90 % / 95 % specificity: the highest "
        "sensitivity of a threshold whose specificity reaches the target at that site."
    )
    st.subheader(f"At threshold {threshold:.3f}")
    show_operating_tables(table, threshold)
    st.subheader("Calibration")
    calibration = calibration_frame(with_pooled(bins))
    positive = common.positive_class_text(data)
    sites = calibration["site"].unique().tolist()
    pick = st.selectbox(
        "Site", sites, index=len(sites) - 1 if "pooled" in sites else 0, key="calibration_site"
    )
    brier = table.set_index("site").loc[pick, "brier"]
    st.caption(
        f"{pick}: Brier score {brier:.3f} (mean squared error of the scores; 0 is perfect, "
        "0.25 is a constant 0.5). Points: mean score against the observed fraction of "
        "positives per score range of 0.1, with 95 % Wilson CIs; on the diagonal the scores are "
        "calibrated probabilities."
    )
    shown = calibration[calibration["site"] == pick]
    base = alt.Chart(shown).encode(
        x=alt.X("mean score:Q", title="mean predicted score", scale=alt.Scale(domain=[0, 1])),
    )
    points = base.mark_point(filled=True).encode(
        y=alt.Y(
            "observed positive fraction:Q",
            title=f"observed fraction of positives ({class_short(positive)})",
            scale=alt.Scale(domain=[0, 1]),
        ),
        size=alt.Size("images:Q", title="images"),
        tooltip=[
            "score range",
            "images",
            alt.Tooltip("observed positive fraction:Q", format=".3f"),
            alt.Tooltip("mean score:Q", format=".3f"),
        ],  # fmt: skip
    )
    bars = base.mark_rule().encode(y="CI low:Q", y2="CI high:Q")
    diagonal = (
        alt.Chart(pd.DataFrame({"x": [0, 1], "y": [0, 1]}))
        .mark_line(strokeDash=[4, 4], color="gray")
        .encode(x="x:Q", y="y:Q")
    )
    st.altair_chart(diagonal + bars + points, width="stretch")


common.page(body)
