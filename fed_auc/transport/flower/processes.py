"""Flower's processes as the launcher handles them: their environment, waiting for a port,
following a log and relaying a child's output as plain text, and stopping a process with every
descendant (SIGTERM, then SIGKILL; children die with their parent).
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from fed_auc.transport.flower.node_watch import (
    REFUSED,
    SupernodeWatch,
)

PROGRESS_POLL_S = 0.2  # how often the coordinator prints new progress lines
STUCK_AFTER_S = 20.0  # a refused SuperNode still running after this is killed
STOP_GRACE_S = 15.0  # how long the coordinator's processes get to stop before SIGKILL
# A terminal escape sequence (CSI, e.g. ``ESC[92m``, or a two-byte one): Flower colours its
# level names even when its output goes to a pipe.
ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")


def flower_env(home: Path) -> dict[str, str]:
    """Environment for Flower's processes: our bin on PATH, telemetry off, own FLWR_HOME."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["FLWR_TELEMETRY_ENABLED"] = "0"
    env["FLWR_DISABLE_UPDATE_CHECK"] = "1"  # no network: the check would only wait
    env["FLWR_HOME"] = str(home)
    # The SuperExec looks for work to start every second by default: a second per message.
    env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1")
    return env


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the SuperNode gets SIGTERM if ``fed-auc node`` dies, even by SIGKILL."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def kill_group(pid: int) -> None:
    """SIGTERM a child's process group (a SuperNode and the SuperExec it spawned)."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def wait_or_unstick(
    supernode: subprocess.Popen,
    log_path: Path,
    start: int,
    stopping: threading.Event,
    watch: SupernodeWatch | None = None,
    echo=print,
) -> None:
    """Wait for the SuperNode to exit, telling ``echo`` what its log says (``watch``). One
    that a new SuperLink refused (401: e.g. after the coordinator restarted) exits by itself,
    but Flower's exit handler can hang in it; such a SuperNode is killed after
    ``STUCK_AFTER_S`` so that a fresh one reconnects."""
    refused_at = None
    while supernode.poll() is None and not stopping.is_set():
        text = read_from(log_path, start)
        for line in watch.feed(text) if watch is not None else ():
            echo(line)
        if refused_at is None and REFUSED in text:
            refused_at = time.monotonic()
        if refused_at is not None and time.monotonic() - refused_at > STUCK_AFTER_S:
            try:
                os.killpg(supernode.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        stopping.wait(1.0)
    if stopping.is_set():
        return
    supernode.wait()


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (Linux ``/proc``; elsewhere none)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state != "Z":
            parents[int(entry.name)] = int(ppid)
    found, todo = [], [pid]
    while todo:
        children = [child for child, parent in parents.items() if parent == todo[-1]]
        todo.pop()
        found += children
        todo += children
    return found


def stop_tree(process: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """Stop ``process`` and everything it started, whatever session they moved to.

    The SuperLink starts its SuperExec in a session of its own and the SuperExec the
    ServerApp: stopping the SuperLink alone can leave them running the federation headless.
    They are found (before their parent goes) and get SIGTERM, then SIGKILL after ``grace_s``.
    """
    below = descendants(process.pid)
    process.terminate()
    deadline = time.monotonic() + grace_s
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for signum in (signal.SIGTERM, signal.SIGKILL):
        left = [pid for pid in below if _alive(pid)]
        for pid in left:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [pid for pid in left if _alive(pid)]
        if not left:
            return
        deadline = time.monotonic() + grace_s


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie does not: it only waits for its parent)."""
    try:
        return not Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            return log.read().decode("utf-8", "replace")
    except OSError:
        return ""


def wait_for_port(address: str, timeout: float, process: subprocess.Popen | None = None) -> None:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process {process.args[0]} exited with {process.returncode}")
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {address} after {timeout:g} s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plain(line: str) -> str:
    """``line`` without terminal escape sequences: in a log file or a console that is not a
    terminal, Flower's colours read as ``[92mINFO [0m``."""
    return ESCAPE.sub("", line)


def relay(lines: Iterable[str], echo) -> None:
    """Echo a child's output lines, one at a time as they come, as plain text."""
    for line in lines:
        echo(plain(line.rstrip()))


def follow_log(path: Path, echo, done: threading.Event, select=None, start: int = 0) -> None:
    """Echo the lines appended to ``path`` from ``start`` as they come, until ``done`` (then
    the rest); ``select(line)``: what to echo for a line (None: nothing), else the line."""
    with open(path, errors="replace") as lines:
        lines.seek(start)
        while True:
            finished = done.is_set()
            for line in lines:
                shown = plain(line.rstrip()) if select is None else select(line)
                if shown is not None:
                    echo(shown)
            if finished:
                return
            done.wait(PROGRESS_POLL_S)


def reachable(address: str) -> str:
    """Where to check that the SuperLink listens: a wildcard host is reached on loopback."""
    host, port = address.rsplit(":", 1)
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "[::]", "::") else address
