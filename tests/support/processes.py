"""The one way tests start a ``fed-auc`` command in a process of its own and wait on it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from tests.support.paths import ROOT


def start_fed_auc(
    cwd: Path, *args: str, log: Path, session: bool = False, unbuffered: bool = True
) -> subprocess.Popen:
    """``fed-auc *args`` of this checkout, run in ``cwd``, its output appended to ``log``.
    ``session``: in a process group of its own (a test can signal the group);
    ``unbuffered`` False drops PYTHONUNBUFFERED, as an operator's shell would not set it."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": path}
    if not unbuffered:
        env.pop("PYTHONUNBUFFERED", None)
    with open(log, "a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "fed_auc.cli", *args],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=session,
        )


# Each site's training slowed by a sleep so a round outlasts a test's kill delay; sleeping
# changes no number the run records.
_SLOWED = """
import sys, time
from fed_auc.node.host import NodeHost
train = NodeHost.train
def slow_train(self, broadcast):
    time.sleep({delay})
    return train(self, broadcast)
NodeHost.train = slow_train
from fed_auc.cli import main
sys.exit(main(sys.argv[1:]))
"""


def slowed_fed_auc_args(*args: str, site_delay_s: float) -> list[str]:
    """The command line of ``fed-auc *args`` in which each site's training first sleeps
    ``site_delay_s``: a test that kills a run mid-way cannot be outrun by a fast machine
    (seen in CI: 4 rounds recorded within a 0.4 s kill delay)."""
    return [sys.executable, "-c", _SLOWED.format(delay=site_delay_s), *args]


def wait_for_line(log: Path, text: str, process: subprocess.Popen, timeout: float) -> None:
    """Block until ``text`` appears in ``log``; fail if ``process`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text():
            return
        assert process.poll() is None, f"{log.name} ended early:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in {log} after {timeout:g} s")


def stop_all(processes: Iterable[subprocess.Popen]) -> None:
    """SIGTERM every process, then wait for each (none is left behind)."""
    processes = list(processes)
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        process.wait(timeout=60)
