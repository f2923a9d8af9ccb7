"""The ServerApp ends with its ``fed-auc coordinator``, however that one ends.

Flower starts the ServerApp from its SuperExec, not from ``fed-auc coordinator``: a coordinator
killed by SIGKILL (or the OOM killer) has no chance to stop it or to mark its run failed, and
the run would stay "running" in the store. The coordinator writes who it is into the
experiment file (its PID and the start time the kernel gives that process, so that a PID
reused by another process is not taken for it); the ServerApp checks every ``WATCH_S`` that
it still runs and, once it is gone, marks the run failed, saying how to continue it, and
exits at once. Linux only (``/proc``); elsewhere nothing is watched.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fed_auc.store.run_store import RunStore

# Flower's own chain (SuperLink, then SuperExec, then ServerApp, each polling its parent every
# 0.2 s) also ends the ServerApp: this watch comes first, and a Flower exit handler is the backstop.
WATCH_S = 0.2


@dataclass(frozen=True)
class ProcessIdentity:
    """A process as the kernel knows it: its PID and when it started."""

    pid: int
    started: int | None  # clock ticks after boot (/proc/PID/stat field 22); None: no /proc

    @classmethod
    def current(cls) -> ProcessIdentity:
        return cls(os.getpid(), start_time(os.getpid()))

    def alive(self) -> bool:
        """Whether this very process still runs (not a zombie, not a PID reused since)."""
        return start_time(self.pid) == self.started

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot; None for no such process or a zombie
    (a SIGKILLed process stays one until its parent reaps it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


def resume_hint(experiment: dict[str, Any]) -> str:
    """How to go on after the run ``experiment["run_id"]`` stopped (a sentence to append)."""
    if "evaluation" in experiment:  # an evaluation job starts again from the start
        return ". Nothing was exported; run the evaluation again"
    if experiment.get("leave_each_out"):  # several runs: the failed one is marked failed
        return ". Runs that completed are kept in the store; start --leave-each-out again"
    run_id, runs_dir = experiment["run_id"], experiment["experiment"]["runs_dir"]
    return (
        f". The run is saved; continue it with "
        f"`fed-auc coordinator --resume {run_id} --runs-dir {runs_dir}`"
    )


def end_with_coordinator(experiment: dict[str, Any]) -> None:
    """In the ServerApp: once the coordinator named in ``experiment`` has ended without
    stopping the run, mark the run failed and exit this process."""
    known = experiment.get("coordinator")
    if known is None or known["started"] is None:
        return
    coordinator = ProcessIdentity(**known)
    once = threading.Lock()  # the watch or Flower's exit handler, whichever comes first

    def abandon() -> None:
        if coordinator.alive():  # the coordinator is stopping us itself (Ctrl-C, SIGTERM)
            return
        with once:  # the other caller waits here until the process exits
            try:
                abandon_run(experiment, coordinator.pid)
            finally:
                os._exit(1)

    def watch() -> None:
        while coordinator.alive():
            time.sleep(WATCH_S)
        abandon()

    threading.Thread(target=watch, name="coordinator-watch", daemon=True).start()
    from flwr.supercore.exit import add_exit_handler

    add_exit_handler(abandon, run_before_force_exit=True)


def abandon_run(experiment: dict[str, Any], pid: int) -> None:
    """Mark the run failed (if it still runs) with why: its coordinator ``pid`` is gone."""
    run_id, runs_dir = experiment["run_id"], experiment["experiment"]["runs_dir"]
    reason = f"the coordinator process (PID {pid}) ended without stopping its run"
    reason += resume_hint(experiment)
    with RunStore(runs_dir) as store:
        store.abandon_run(run_id, reason)
