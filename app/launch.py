"""Start and stop ``fed-auc dashboard`` as a process and wait until Streamlit answers: one
way for the screenshots, the process tests and the wheel test. Streamlit renders over a
websocket, so "started" means its health endpoint answers, never a fixed wait."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

STARTUP_S = 240  # a start took over a minute here with 2 cores shared by 4 jobs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_dashboard(
    runs_dir: str | Path,
    port: int | None = None,
    command: Sequence[str | Path] = (sys.executable, "-m", "fed_auc.cli"),
    options: Sequence[str] = (),
    **popen: Any,
) -> tuple[subprocess.Popen, str]:
    """``command dashboard`` over ``runs_dir`` on ``port`` (default: a free one) with further
    ``options`` (e.g. ``--auth oidc``), stdout discarded, stderr piped; returns the process
    and its URL once it answers. One that exits or does not answer within ``STARTUP_S`` is
    killed and RuntimeError carries its stderr."""
    port = port or free_port()
    process = subprocess.Popen(
        [*command, "dashboard", "--runs-dir", str(runs_dir), "--port", str(port), *options],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **popen,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_S
    while True:
        try:
            urllib.request.urlopen(f"{url}/_stcore/health", timeout=2)
            return process, url
        except OSError:
            exited = process.poll() is not None
            if exited or time.monotonic() > deadline:
                if not exited:
                    process.kill()  # its Streamlit gets SIGTERM from the kernel
                    process.wait()
                with process.stderr:
                    error = process.stderr.read().decode(errors="replace")
                raise RuntimeError(f"dashboard did not start on {url}: {error}") from None
            time.sleep(0.3)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to ``fed-auc dashboard``: it passes it on to Streamlit and waits for it. Killed
    after 20 s; even then its Streamlit gets SIGTERM from the kernel (``PR_SET_PDEATHSIG``)."""
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stderr is not None:
        process.stderr.close()
