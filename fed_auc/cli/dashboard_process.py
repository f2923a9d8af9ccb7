"""``fed-auc dashboard``: Streamlit over a runs directory, as a child process that never
outlives the command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_dashboard_parser(sub: argparse._SubParsersAction) -> None:
    dashboard = sub.add_parser("dashboard", help="open the Streamlit dashboard over a run store")
    dashboard.add_argument("--runs-dir", default="runs")
    dashboard.add_argument("--port", type=int, default=8501)
    dashboard.add_argument("--host", default="127.0.0.1", help="address to listen on")


def dashboard_command(args: argparse.Namespace) -> int:
    return dashboard(args.runs_dir, args.port, args.host)


def dashboard(runs_dir: str, port: int, host: str) -> int:
    """``streamlit run app/streamlit_app.py``, headless, no usage statistics; the runs
    directory travels in FED_AUC_RUNS_DIR. The app ships in the wheel beside ``fed_auc``.

    SIGTERM, SIGINT and SIGHUP are passed on to Streamlit and waited for, and Streamlit is
    told by the kernel to stop if this process dies anyway: it never outlives the command."""
    import importlib.util
    import os
    import signal
    import subprocess

    script = Path(__file__).resolve().parents[2] / "app" / "streamlit_app.py"
    if not script.exists():
        raise SystemExit(f"fed-auc dashboard: no app at {script} (this installation lacks app/)")
    if importlib.util.find_spec("streamlit") is None:  # before printing a URL nothing serves
        raise SystemExit(
            "fed-auc dashboard needs the dashboard extra (streamlit is missing): "
            "pip install -c constraints.txt -e '.[dashboard]'"
        )
    env = {**os.environ, "FED_AUC_RUNS_DIR": str(Path(runs_dir).resolve())}
    command = [
        sys.executable, "-m", "streamlit", "run", str(script),
        "--server.headless", "true", "--server.port", str(port), "--server.address", host,
        "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal",
    ]  # fmt: skip
    print(f"fed-auc dashboard: http://{host}:{port} over {runs_dir}", file=sys.stderr)
    process = subprocess.Popen(command, env=env, preexec_fn=_stop_with_parent)
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        process.send_signal(signum)

    forwarded = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {s: signal.signal(s, forward) for s in forwarded}
    try:
        code = process.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if process.poll() is None:  # an exception here: never leave Streamlit serving
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    return 0 if received and code in (0, -received[-1]) else code


def _stop_with_parent() -> None:
    """In the child before exec: SIGTERM it when its parent dies (Linux ``PR_SET_PDEATHSIG``),
    so that even a SIGKILLed ``fed-auc dashboard`` leaves no Streamlit behind."""
    import ctypes
    import signal

    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
