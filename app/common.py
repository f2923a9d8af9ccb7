"""What every page shares: the runs directory, cached queries, the run picker, run banners.

Queries are cached with a key that changes whenever the store is written (file mtime and
size), so pages are fast and a live run still shows its newest round.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import streamlit as st

from app import gate, queries
from app.queries import RunData

RUNS_DIR_ENV = "FED_AUC_RUNS_DIR"
RUN_KEY = "run_id"
LIVE_REFRESH_S = 5.0
STALE_S = 600.0  # a "running" run silent for this long has probably lost its coordinator


def runs_dir() -> Path:
    return Path(os.environ.get(RUNS_DIR_ENV, "runs"))


@st.cache_data(ttl=600, show_spinner=False)
def _runs(directory: str, version: float) -> pd.DataFrame:
    return queries.runs(directory)


@st.cache_data(ttl=600, show_spinner=False, max_entries=32)
def _run_data(directory: str, run_id: str, version: float) -> RunData:
    return queries.run_data(directory, run_id)


@st.cache_data(ttl=600, show_spinner=False, max_entries=64)
def _roc_points(directory: str, run_id: str, round_: int, version: float) -> dict:
    return queries.roc_points(directory, run_id, round_)


def load_roc_points(run_id: str, round_: int) -> dict:
    """Per site, one round's stored ROC points (kept out of ``load_run``: most of its bytes)."""
    directory = runs_dir()
    return _roc_points(str(directory), run_id, round_, queries.store_version(directory))


@st.cache_data(ttl=600, show_spinner=False, max_entries=32)
def _comparisons(directory: str, run_ids: tuple[str, ...], version: float) -> pd.DataFrame:
    return queries.comparisons(directory, list(run_ids))


def load_comparisons(run_ids: list[str]) -> pd.DataFrame:
    """The recorded paired comparisons between any two of ``run_ids`` (runs the viewer may
    see: the Compare page offers no other)."""
    directory = runs_dir()
    return _comparisons(str(directory), tuple(run_ids), queries.store_version(directory))


def load_runs() -> pd.DataFrame | None:
    """The runs the viewer may see (all without sign-in), or None when the runs directory
    has no store yet."""
    directory = runs_dir()
    if not queries.store_path(directory).exists():
        return None
    try:
        runs = _runs(str(directory), queries.store_version(directory))
    except queries.UnreadableStore as exc:  # its message, never a traceback in the page
        st.error(str(exc))
        st.stop()
    return gate.visible_runs(runs)


def load_run(run_id: str) -> RunData:
    """One run, if the viewer may see it (the picker offers no other; this guards the rest)."""
    runs = load_runs()
    if runs is None or run_id not in set(runs["id"]):
        st.error(f"No run {run_id} that you may see in this store.")
        st.stop()
    directory = runs_dir()
    return _run_data(str(directory), run_id, queries.store_version(directory))


def run_picker() -> None:
    """Sidebar select box of runs, newest first, each by its id (what fits the box at any
    window width); under it the picked run's whole label, wrapped, so that runs can be told
    apart (algorithm · data · transport · sites · AUC · status · start · id · positive
    class)."""
    runs = load_runs()
    st.sidebar.caption(f"Run store: `{queries.store_path(runs_dir())}`")
    if runs is None or runs.empty:
        return
    if st.session_state.get(RUN_KEY) not in set(runs["id"]):
        st.session_state[RUN_KEY] = landing_run(runs)
    st.sidebar.selectbox("Run", list(runs["id"]), key=RUN_KEY)  # the id: it fits the box
    row = runs[runs["id"] == st.session_state[RUN_KEY]].iloc[0]
    st.sidebar.caption(f"{row['label']} · positive class {row['positive_class']}")


def landing_run(runs: pd.DataFrame) -> str:
    """The run the dashboard opens on: the newest training run (not an evaluation job, not a
    warm-up, which its main run names), else the newest run."""
    training = runs[[queries.is_training(row) for row in runs.to_dict("records")]]
    return str((training if not training.empty else runs)["id"].iloc[0])


def picked_run(runs: pd.DataFrame) -> str:
    """The run picked in the sidebar, or the landing run before the picker has drawn."""
    picked = st.session_state.get(RUN_KEY)
    return picked if picked in set(runs["id"]) else landing_run(runs)


def current_run() -> RunData:
    """The picked run, after a banner for failed and live runs; stops the page with a message
    when there is nothing to show yet."""
    runs = load_runs()
    if runs is None:
        st.info(
            f"No run store in `{runs_dir()}` yet. Start a federation, e.g. "
            f"`fed-auc demo --runs-dir {runs_dir()}`, then reload."
        )
        st.stop()
    if runs.empty:
        st.info(f"The run store in `{runs_dir()}` has no runs yet.")
        st.stop()
    run_id = picked_run(runs)
    data = load_run(run_id)
    status_banner(data)
    synthetic_badge(data)
    positive_class_caption(data)
    if data.rounds.empty and data.run["algorithm"] == "evaluate":
        st.info("This run is an evaluation job (no training round): see the Evaluations page.")
        st.stop()
    if data.rounds.empty:
        st.info("No round recorded yet: the run has started, its first evaluation is pending.")
        st.stop()
    return data


def synthetic_badge(data: RunData) -> None:
    """Say it plainly when every site's data are synthetic."""
    sources = {(s or {}).get("source") for s in data.sites["summary"]}
    if sources == {"synthetic"}:
        st.badge("Synthetic data", icon=":material/science:", color="orange")
        st.caption(
            "Every site of this run holds generated images, not patients: its numbers say "
            "nothing about clinical performance."
        )


def positive_class_caption(data: RunData) -> None:
    """Name the positive class on every page: each AUC, sensitivity, ROC curve and operating
    point of the run is about it (BreastMNIST's file label 1 is *benign*)."""
    st.caption(f"Positive class: {positive_class_text(data)}")


def positive_class_text(data: RunData) -> str:
    return queries.positive_class(data.sites["summary"])


def status_banner(data: RunData) -> None:
    run = data.run
    done = data.rounds["round"].max() if not data.rounds.empty else None
    planned = data.planned_rounds
    progress = f"round {done if done is not None else '–'} of {planned or '?'}"
    st.caption(f"Run {run['id']} · {run['algorithm']} · {run['status']} · {progress}")
    warmup_link(data)
    if run["status"] == "failed":
        error = (run.get("summary") or {}).get("error", "no error message recorded")
        st.error(f"Run {run['id']} failed at {progress}: {error}")
    elif run["status"] == "running":
        last_write = data.rounds["finished_at"].max() if done is not None else run["started_at"]
        silent = time.time() - last_write
        if silent > STALE_S:
            st.warning(
                f"Run {run['id']} is marked running but has recorded nothing for "
                f"{silent / 60:.0f} min ({progress}): its coordinator may have stopped."
            )
        else:
            st.info(f"Run {run['id']} is live: {progress}.")


def _open_run(run_id: str) -> None:
    st.session_state[RUN_KEY] = run_id


def warmup_link(data: RunData) -> None:
    """A warm-up run names the run it warm-started, and a warm-started run its warm-up, each
    with a button that opens the other."""
    runs = load_runs()
    main = data.warmup_for
    if main:
        text = (
            f"Warm-up of run {main}: {data.planned_rounds or '?'} rounds of fedavg with "
            "cross-entropy that started its AUC phase, recorded as a run of its own (its "
            "rounds are numbered from 0; its sites are the main run's)."
        )
        other, button = main, "Open main run"
    else:
        warm = runs[[queries.warmup_for(r) == data.run["id"] for r in runs.to_dict("records")]]
        if warm.empty:
            return
        other, button = str(warm["id"].iloc[0]), "Open warm-up"
        text = f"Warm-started by run {other} (fedavg with cross-entropy, a run of its own)."
    cols = st.columns([3, 1], vertical_alignment="center")
    cols[0].info(text)
    if other in set(runs["id"]) and cols[1].button(
        button, on_click=_open_run, args=(other,), key="warmup_link"
    ):
        st.rerun()  # the whole app (a live run's page is a fragment): the picker follows


def page(body: Callable[[RunData], None]) -> None:
    """Render a page's body for the picked run; re-rendered every few seconds while it is live."""

    def render() -> None:
        body(current_run())

    runs = load_runs()
    picked = st.session_state.get(RUN_KEY)
    live = runs is not None and not runs.empty and picked is not None
    live = live and (runs.loc[runs["id"] == picked, "status"] == "running").any()
    if live:
        st.fragment(render, run_every=LIVE_REFRESH_S)()
    else:
        render()
