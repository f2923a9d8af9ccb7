"""Sites: does the model work at each hospital, and how sure are we (AUC with 95 % CI)."""

import altair as alt
import pandas as pd
import streamlit as st

from app import common
from app.queries import RunData
from app.tables import evaluated_rounds, fmt, site_table


def body(data: RunData) -> None:
    st.title("Sites")
    rounds = evaluated_rounds(data)
    if not rounds:
        st.info("No site has been evaluated in this run yet.")
        return
    round_ = rounds[-1]
    if len(rounds) > 1:
        round_ = st.select_slider("Round", rounds, value=rounds[-1], key="sites_round")
    table = site_table(data, round_)
    at_round = data.rounds[data.rounds["round"] == round_]
    worst = at_round["worst_site_auc"].iloc[0] if not at_round.empty else None
    cols = st.columns(3)
    cols[0].metric("Worst-site AUC", fmt(worst))
    cols[1].metric("Sites evaluated", len(table))
    cols[2].metric("Sites with undefined AUC", int(table["AUC"].isna().sum()))
    st.caption(
        f"Test split of each site, global model after round {round_}. 95 % CI: Hanley–McNeil. "
        "An AUC is undefined where the site's test split has only one class."
    )
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            c: st.column_config.NumberColumn(format="%.3f")
            for c in table.columns
            if c in ("AUC", "CI low", "CI high", "personal AUC") or c.startswith("prevalence")
        },
    )
    defined = table.dropna(subset=["AUC"])
    if defined.empty:
        return
    base = alt.Chart(defined).encode(y=alt.Y("site:N", title=None))
    ci = base.mark_rule().encode(
        x=alt.X("CI low:Q", title="test AUC (95 % CI)", scale=alt.Scale(domain=[0, 1])),
        x2="CI high:Q",
    )
    point = base.mark_point(filled=True, size=80).encode(
        x="AUC:Q", tooltip=["site", alt.Tooltip("AUC:Q", format=".3f"), "n test"]
    )
    chance = alt.Chart(pd.DataFrame({"x": [0.5]})).mark_rule(strokeDash=[4, 4]).encode(x="x:Q")
    st.altair_chart(ci + point + chance, width="stretch")
    if "personal AUC" in table:
        st.subheader("Personal vs global model")
        pair = table.melt("site", ["AUC", "personal AUC"], var_name="model", value_name="value")
        bars = (
            alt.Chart(pair.dropna())
            .mark_bar()
            .encode(x="value:Q", y="site:N", yOffset="model:N", color="model:N")
        )
        st.altair_chart(bars, width="stretch")


common.page(body)
