"""Sites: does the model work at each hospital, and how sure are we (AUC with 95 % CI and the
counts behind it). The exported model first; the last round or any round as other views."""

import altair as alt
import pandas as pd
import streamlit as st

from app import common, privacy
from app.charts import rows_autosize, rows_height
from app.model_view import (
    LAST,
    MIN_CLASS_COUNT,
    ModelChoice,
    choices,
    coverage,
    readable_status,
    site_status,
)
from app.queries import RunData
from app.tables import auc_header, ci_header, evaluated_rounds, fmt, site_table

ANY_ROUND = "a round of training"


def pick_model(data: RunData) -> ModelChoice:
    """Radio: the exported model, the last round, or any evaluated round."""
    options = choices(data)
    names = [c.title for c in options] + [ANY_ROUND]
    picked = st.radio("Model", names, horizontal=True, key="sites_model")
    if picked != ANY_ROUND:
        return options[names.index(picked)]
    rounds = evaluated_rounds(data)
    round_ = st.select_slider("Round", rounds, value=rounds[-1], key="sites_round")
    last = options[-1]
    return ModelChoice(
        LAST, round_, f"Global model after round {round_}", last.thresholds, last.threshold_note
    )


def body(data: RunData) -> None:
    st.title("Sites")
    if not evaluated_rounds(data):
        st.info("No site has been evaluated in this run yet.")
    else:
        performance(data)
    privacy_section(data)


def performance(data: RunData) -> None:
    """Per-site AUC of the picked model with CIs, counts and who was not scored."""
    choice = pick_model(data)
    table = site_status(data, choice)
    cover = coverage(table)
    cols = st.columns(4)
    cols[0].metric("Sites scored", f"{len(cover.scored)} of {cover.total}")
    cols[1].metric("Mean site AUC", fmt(cover.mean_auc))
    cols[2].metric("Worst-site AUC", fmt(cover.worst_auc))
    cols[3].metric("Sites with a one-class test split", len(cover.scored) - len(cover.defined))
    st.caption(
        f"{choice.caption}; {choice.ci_text}. Mean and worst over {cover.sentence()}. Sorted "
        f"by the lower end of the 95 % CI. 'few cases': under {MIN_CLASS_COUNT} test positives "
        "or negatives, so its AUC is mostly noise. An AUC is undefined only where the test "
        "split has one class."
    )
    for site in cover.missing:
        st.warning(f"{site}: {table.set_index('site').loc[site, 'note']}")
    extra = site_table(data, choice.round).set_index("site") if choice.key == LAST else None
    positive = common.positive_class_text(data)
    st.dataframe(
        readable_status(table, extra, positive, choice.ci_method), hide_index=True, width="stretch"
    )
    defined = table.dropna(subset=["AUC"])
    if defined.empty:
        return
    order = defined["site"].tolist()
    base = alt.Chart(defined).encode(
        y=alt.Y("site:N", title=None, sort=order, axis=alt.Axis(labelOverlap=False, labelLimit=200))
    )
    axis = f"test {auc_header(positive)}, {ci_header(choice.ci_method)}"
    ci = base.mark_rule().encode(
        x=alt.X("CI low:Q", title=axis, scale=alt.Scale(domain=[0, 1])), x2="CI high:Q"
    )
    point = base.mark_point(filled=True, size=80).encode(
        x="AUC:Q",
        shape=alt.Shape("few cases:N", title=f"< {MIN_CLASS_COUNT} of a class"),
        tooltip=[
            "site",
            alt.Tooltip("AUC:Q", format=".3f", title=auc_header(positive)),
            alt.Tooltip("CI low:Q", format=".3f"),
            alt.Tooltip("CI high:Q", format=".3f"),
            "positives",
            "negatives",
        ],
    )
    chance = alt.Chart(pd.DataFrame({"x": [0.5]})).mark_rule(strokeDash=[4, 4]).encode(x="x:Q")
    forest = (ci + point + chance).properties(
        height=rows_height(len(defined)), autosize=rows_autosize()
    )  # one labelled row per site: the height is the rows', the axes come on top
    st.altair_chart(forest, width="stretch")
    if extra is not None and "personal AUC" in extra:
        st.subheader("Personal vs global model")
        pair = extra.reset_index().melt(
            "site", ["AUC", "personal AUC"], var_name="model", value_name="value"
        )
        bars = (
            alt.Chart(pair.dropna())
            .mark_bar()
            .encode(
                x=alt.X("value:Q", title=f"test {auc_header(positive)}"),
                y=alt.Y("site:N", title=None),
                yOffset="model:N",
                color="model:N",
            )
        )
        st.altair_chart(bars, width="stretch")


def privacy_section(data: RunData) -> None:
    """The run's DP and the ε each site has spent (per example under DP-SGD, per site under
    update-level DP), per round and in total."""
    settings = privacy.dp_settings(data.run["config"])
    if settings is None:
        st.caption("No differential privacy in this run.")
        return
    st.subheader("Differential privacy")
    mode = {"example": "example-level (DP-SGD)", "update": "update-level (site-level ε)"}[
        settings.mode
    ]
    mode = mode if settings.accounted else "update-level (clipping only)"
    parts = [f"Mode: {mode}", f"clip C = {settings.clip:g}", f"noise: {settings.noise_text()}"]
    if settings.accounted:
        parts.append(f"δ = {settings.delta:g}")
    st.markdown(" · ".join(parts))
    if not settings.accounted:
        st.caption(privacy.CLIP_ONLY_SCOPE)
        return
    st.markdown(f"ε is for the neighbouring relation: **{privacy.relation(data, settings.mode)}**")
    st.caption(privacy.EXAMPLE_SCOPE if settings.mode == "example" else privacy.UPDATE_SCOPE)
    summary = data.run.get("summary") or {}
    exported = summary.get("selected_round")
    table = privacy.epsilon_table(data, None if exported is None else int(exported))
    if table.empty:
        st.info("No site has reported an ε yet.")
        return
    for row in table[table["budget"] != "open"].to_dict("records"):
        st.warning(
            f"{row['site']}: privacy budget {row['budget']} (ε = {row['ε spent']:.3f}"
            f"{settings.of_target()}); it sends no further update."
        )
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            c: st.column_config.NumberColumn(format="%.3f")
            for c in ("ε spent", "ε at the exported round", "σ")
        },
    )
    by_round = privacy.epsilon_by_round(data)
    long = by_round.reset_index().melt("round", var_name="site", value_name="ε")
    line = (
        alt.Chart(long.dropna())
        .mark_line(point=True)
        .encode(
            x=alt.X("round:Q", title="round", axis=alt.Axis(tickMinStep=1)),
            y=alt.Y("ε:Q", title="ε spent so far"),
            color=alt.Color("site:N"),
            tooltip=["site", "round", alt.Tooltip("ε:Q", format=".3f")],
        )
    )
    if settings.target_epsilon is not None:
        target = pd.DataFrame({"ε": [settings.target_epsilon]})
        line = line + alt.Chart(target).mark_rule(strokeDash=[4, 4]).encode(y="ε:Q")
    st.altair_chart(line, width="stretch")
    with st.expander("ε per site and round"):
        st.dataframe(by_round, width="stretch")


common.page(body)
