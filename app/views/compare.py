"""Compare: two or more runs side by side — AUC per round and per MB sent, in distinct
colours, the settings in which the runs differ, and the paired AUC difference of two runs'
exported models on the same test images where ``fed-auc runs --compare`` recorded it."""

import altair as alt
import pandas as pd
import streamlit as st

from app import common
from app.queries import RunData
from app.tables import PALETTE, auc_header, compare_table, differing_settings, paired_table


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
    frames, configs, exported, algorithms = [], {}, {}, {}
    for run_id in picked:
        run = common.load_run(run_id)
        algorithms[run_id] = run.run["algorithm"]
        rounds = run.rounds[["round", "global_auc", "worst_site_auc", "cumulative_mb"]].copy()
        rounds["run"] = f"{run.run['algorithm']} · {run_id}"
        frames.append(rounds)
        exported[rounds["run"].iloc[0] if not rounds.empty else run_id] = (
            run.run["summary"] or {}
        ).get("exported_auc")
        configs[rounds["run"].iloc[0] if not rounds.empty else run_id] = {
            "algorithm": run.run["algorithm"],
            "data source": run.run["data_source"],
            "transport": run.run["transport"],
            "sites": int(run.run["n_sites"]),
            "positive class": common.positive_class_text(run),
            **(run.run["config"] or {}),
        }
    table = pd.concat(frames, ignore_index=True)
    classes = {name: c["positive class"] for name, c in configs.items()}
    st.caption(
        "Pooled test AUC over all sites' test splits; the last round's figures cover the sites "
        "scored in it, the exported model's is its model card's. Each about its run's "
        "positive class."
    )
    st.dataframe(compare_table(table, exported, classes), width="stretch")
    settings = differing_settings(configs)
    st.subheader("Settings that differ")
    if len(configs) < 2:
        st.caption("Pick a second run to see how their settings differ.")
    elif settings.empty:
        st.caption("The runs' recorded settings are identical (a repeat, e.g. another run).")
    else:
        st.dataframe(settings, width="stretch")
    paired_section(picked, algorithms)
    names = list(configs)
    colors = alt.Scale(domain=names, range=[PALETTE[i % len(PALETTE)] for i in range(len(names))])
    metric = st.radio(
        "AUC",
        ["global_auc", "worst_site_auc"],
        horizontal=True,
        format_func={"global_auc": "pooled test", "worst_site_auc": "worst site"}.get,
    )
    one = set(classes.values())
    axis = f"test {auc_header(one.pop()) if len(one) == 1 else 'AUC (each run’s positive class)'}"
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
                y=alt.Y(f"{metric}:Q", title=axis, scale=alt.Scale(zero=False)),
                color=alt.Color(
                    "run:N", scale=colors, legend=alt.Legend(orient="bottom", columns=1)
                ),
                tooltip=[
                    "run",
                    "round",
                    alt.Tooltip(f"{metric}:Q", format=".3f"),
                    alt.Tooltip("cumulative_mb:Q", format=".1f"),
                ],
            )
        )
        col.altair_chart(chart, width="stretch")


def paired_section(picked: list[str], algorithms: dict[str, str]) -> None:
    """Each recorded comparison between two of the picked runs, or the command that records
    one: computed where the test images are, never here."""
    st.subheader("Paired difference on the same test images")
    if len(picked) < 2:
        st.caption("Pick two runs on the same sites and split to see their paired difference.")
        return
    recorded = common.load_comparisons(picked)
    if recorded.empty:
        a, b = picked[:2]
        st.info(
            f"No paired comparison of runs {a} and {b} recorded. Compute it where their test "
            f"images are: `fed-auc runs --compare {a} {b} --runs-dir {common.runs_dir()}`"
        )
        return
    for (a, b, split), rows in recorded.groupby(["run_a", "run_b", "split"], sort=False):
        sites = sorted(set(rows["site"]) - {"pooled"})
        classes = ", ".join(dict.fromkeys(rows["positive_class"].fillna("not recorded")))
        st.caption(
            f"A = {algorithms[a]} run {a}, B = {algorithms[b]} run {b}: exported models on the "
            f"{split} split of {len(sites)} site(s) ({', '.join(sites)}), positive class "
            f"{classes}. "
            "A − B is AUC A minus AUC B on the same test images, with its paired interval; "
            "pooled: all these sites' test images together. Recorded by `fed-auc runs "
            "--compare`."
        )
        st.dataframe(paired_table(rows), width="stretch")


common.page(body)
