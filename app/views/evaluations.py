"""Evaluations: a model scored at every site of a federation (fed-auc evaluate --federation, or
a hold-out training run scoring its export): per-site AUC with the node's bootstrap 95 % CI as a
forest plot, the pooled AUC from binned counts, held-out sites marked, sites that did not
report, and the operating-point table at the model card's threshold; then the prediction jobs
(fed-auc predict) that used the run's model. Reads the store only."""

import altair as alt
import streamlit as st

from app import common
from app.charts import rows_autosize, rows_height
from app.clinical import card_edge, operating_table, show_operating_tables
from app.evaluations_data import (
    POOLED_SCORES,
    failures,
    forest,
    jobs,
    label_bins,
    readable_forest,
    site_rows,
)
from app.predictions_data import prediction_jobs, readable_jobs
from app.tables import auc_header, ci_header
from fed_auc.metrics.wording import BOOTSTRAP

COLOURS = alt.Scale(
    domain=["trained on", "held out", "pooled"], range=["#4c78a8", "#e45756", "#333333"]
)


def body(run_id: str) -> None:
    st.title("Evaluations")
    positive = common.positive_class_text(common.load_run(run_id))
    st.caption(f"Positive class: {positive}")
    table = jobs(common.runs_dir(), run_id)
    table = table[table["run_id"].isin(common.load_runs()["id"])]  # jobs the viewer may see
    if table.empty:
        st.info(
            "No evaluation job recorded under this run, and none scored its model. "
            "`fed-auc evaluate --federation CONFIG` records one as its own run; `--hold-out "
            "SITE` training runs record their export's."
        )
        return
    job_runs = list(dict.fromkeys(table["run_id"]))  # newest first, this run's own first
    if len(job_runs) > 1:
        job_run = st.selectbox(
            "Evaluation job", job_runs, format_func=lambda r: _job_label(r, run_id), key="job"
        )
    else:
        job_run = job_runs[0]
    table = table[table["run_id"] == job_run]
    splits = table["split"].tolist()
    split = st.selectbox("Split", splits) if len(splits) > 1 else splits[0]
    job = table[table["split"] == split].iloc[0]
    names = job["label_names"]
    label = st.selectbox("Finding", names) if len(names) > 1 else names[0]
    sites = site_rows(common.runs_dir(), job_run, split)
    held = job["held_out"] or []
    where = "this run" if job_run == run_id else f"run {job_run}"
    st.caption(
        f"Model {job['model']} (trained in run {job['model_run_id']}), {split} split, scored "
        f"in {where} {_how(job)} at {len(sites)} site(s); held out (never trained on): "
        f"{', '.join(held) or 'none'}. {_methods(job, label)}"
    )
    frame = forest(job, sites, label)
    defined = frame.dropna(subset=["auc"])
    if not defined.empty:
        base = alt.Chart(defined).encode(
            y=alt.Y(
                "site:N", sort=None, title=None, axis=alt.Axis(labelOverlap=False, labelLimit=300)
            ),
            color=alt.Color("kind:N", scale=COLOURS, title=None),
        )
        axis = f"{split} {auc_header(positive)}, {ci_header(BOOTSTRAP)}"
        bars = base.mark_rule().encode(
            x=alt.X("ci_lo:Q", title=axis, scale=alt.Scale(domain=[0, 1])), x2="ci_hi:Q"
        )
        points = base.mark_point(filled=True, size=80).encode(
            x="auc:Q", shape=alt.Shape("kind:N", title=None),
            tooltip=["site", "kind", "n", "positives",
                     alt.Tooltip("auc:Q", format=".3f", title=auc_header(positive)),
                     alt.Tooltip("ci_lo:Q", format=".3f", title="95 % CI low"),
                     alt.Tooltip("ci_hi:Q", format=".3f", title="95 % CI high"), "method"],
        )  # fmt: skip
        chart = (bars + points).properties(
            height=rows_height(len(defined)), autosize=rows_autosize()
        )  # one labelled row per site and the pooled row
        st.altair_chart(chart, width="stretch")
    st.dataframe(readable_forest(frame, positive), hide_index=True, width="stretch")
    missing = failures(job)
    if not missing.empty:
        st.warning("Sites that did not report: " + "; ".join(
            f"{r.site} ({r.reason})" for r in missing.itertuples()))  # fmt: skip
    bins = label_bins(job, sites, label)
    threshold = None
    for row in sites.itertuples():
        if row.labels is not None:
            threshold = row.labels[label]["threshold"]
            break
    if bins and threshold is not None:
        st.subheader(f"Operating point at the card's threshold {threshold:.3f}")
        threshold, note = card_edge(bins, threshold)
        if note:
            st.warning(note)
        show_operating_tables(operating_table(bins, threshold), threshold)


def _how(job) -> str:
    """Where the scores were computed: on each node (over Flower, or in-process for a
    simulated hold-out run), or all on this machine (local ``fed-auc evaluate --site``: an
    ``evaluate`` run over the local transport)."""
    runs = common.load_runs().set_index("id")
    run = runs.loc[job["run_id"]] if job["run_id"] in runs.index else None
    if job["transport"] == "flower":
        return "on each node over Flower"
    if run is not None and run["algorithm"] == "evaluate":
        return "locally (every site's test images scored on one machine)"
    return "on each in-process node"


def _methods(job, label: str) -> str:
    """The caption's sentence on how each interval was computed, as it was."""
    sites = "95 % CIs: percentile bootstrap of each site's scores"
    pooled = (job["pooled"] or {}).get(label)
    if pooled is None:
        return sites + "."
    if pooled.get("pooled_from") == POOLED_SCORES:
        return sites + "; pooled: all sites' scores together, the same bootstrap."
    return (
        sites + " (on its node); pooled: from the sites' binned score counts (no score left a "
        "node), its CI a bootstrap of those counts, its AUC exact within the "
        "'bin error ≤' column."
    )


def _job_label(job_run: str, run_id: str) -> str:
    return "recorded under this run" if job_run == run_id else f"scored in run {job_run}"


def main() -> None:
    """The picked run's jobs; an evaluation-only run has no rounds, so the page does not wait
    for one as the training pages do."""
    runs = common.load_runs()
    if runs is None or runs.empty:
        st.title("Evaluations")
        st.info(f"No runs in `{common.runs_dir()}` yet.")
        return
    run_id = common.picked_run(runs)
    body(run_id)
    predictions(run_id)


def predictions(run_id: str) -> None:
    """The prediction jobs that used this run's model: counts and where their files are (the
    scores stay in those files, at the site)."""
    jobs_frame = prediction_jobs(common.runs_dir(), run_id)
    st.subheader("Prediction jobs")
    if jobs_frame.empty:
        st.caption(f"No `fed-auc predict` job has used run {run_id}'s model.")
        return
    st.caption(
        f"`fed-auc predict` jobs that scored new images with run {run_id}'s model: how many "
        "images, how many could not be read, how many were called positive at the card's "
        "threshold, and where the CSV and structured reports are. Scores and patient "
        "identifiers stay in those files."
    )
    st.dataframe(readable_jobs(jobs_frame), hide_index=True, width="stretch")


main()
