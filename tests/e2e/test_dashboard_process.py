"""`fed-auc dashboard` as a process: SIGTERM and SIGINT reach Streamlit, and nothing listens
on the port afterwards; even a SIGKILLed command leaves no Streamlit behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from app.launch import free_port, start_dashboard

pytestmark = pytest.mark.slow


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[1].split()[0] == "Z")


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def start(tmp_path: Path) -> tuple[subprocess.Popen, int, int]:
    """The dashboard on a free port, once it answers; returns it, its port and Streamlit's pid."""
    port = free_port()
    process, _ = start_dashboard(tmp_path, port)
    (streamlit,) = children(process.pid)
    return process, port, streamlit


def wait_gone(pid: int, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_command_stops_streamlit_and_frees_the_port(tmp_path, signum):
    process, port, streamlit = start(tmp_path)
    stderr = b""
    try:
        process.send_signal(signum)
        assert process.wait(timeout=30) == 0
        stderr = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
        process.stderr.close()
    assert wait_gone(streamlit), "Streamlit outlived fed-auc dashboard"
    assert not listening(port)
    assert b"can abort the /_stcore/stream" not in stderr  # the websockets warning is gone


def test_even_a_killed_command_leaves_no_streamlit_behind(tmp_path):
    process, port, streamlit = start(tmp_path)
    process.kill()
    process.wait()
    process.stderr.close()
    assert wait_gone(streamlit), "Streamlit outlived a SIGKILLed fed-auc dashboard"
    assert not listening(port)
