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

from app.launch import free_port, start_dashboard, stop

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


HOSTILE_ENV = {
    "STREAMLIT_SERVER_ALLOWED_HOSTS": "*",
    "STREAMLIT_SERVER_ENABLE_AGENT_API": "true",
    "STREAMLIT_SERVER_TRUSTED_USER_HEADERS": '{"X-Forwarded-Email": "email"}',
    "STREAMLIT_SERVER_ENABLE_XSRF_PROTECTION": "false",
}


def _stream(port: int, host: str) -> str:
    """The status line Streamlit answers a websocket handshake on ``/_stcore/stream`` (where
    every run id would flow) that carries ``host`` as its Host header, as a browser sends it."""
    import base64

    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /_stcore/stream HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Protocol: streamlit\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request.encode())
        return s.recv(4096).decode(errors="replace").splitlines()[0]


def test_a_rebinding_page_and_a_hostile_environment_get_nothing(tmp_path):
    """The web page: the attacker's name points at 127.0.0.1, so its requests carry Host
    rebind.attacker.example; the environment: STREAMLIT_* variables and a ~/.streamlit that
    accept every host and turn on the agent API and trusted user headers. Streamlit answers
    loopback's names only, and serves no agent API."""
    import json
    import urllib.request

    from tests.support.dashboard_store import fill

    fill(tmp_path / "runs")
    home = tmp_path / "home"
    (home / ".streamlit").mkdir(parents=True)
    (home / ".streamlit" / "config.toml").write_text(
        '[server]\nallowedHosts = ["*"]\nenableAgentApi = true\n'
        '[client]\nallowedOrigins = ["https://evil.example"]\n'
    )
    env = {**os.environ, **HOSTILE_ENV, "HOME": str(home)}
    process, url = start_dashboard(tmp_path / "runs", env=env, cwd=tmp_path)
    port = int(url.rsplit(":", 1)[1])
    try:
        refused = _stream(port, f"rebind.attacker.example:{port}")
        opened = _stream(port, f"127.0.0.1:{port}")
        with urllib.request.urlopen(f"{url}/_stcore/agent/openapi.json", timeout=30) as r:
            agent = json.load(r)
        with urllib.request.urlopen(f"{url}/_stcore/host-config", timeout=30) as r:
            host_config = json.load(r)
    finally:
        stop(process)
    assert refused.split()[1] == "403", refused
    assert opened.split()[1] == "101", opened  # loopback's own name: answered
    assert agent["info"]["x-streamlit-agent-api"] == "disabled"
    assert host_config["allowedOrigins"] == []  # no other site's frame drives the app
