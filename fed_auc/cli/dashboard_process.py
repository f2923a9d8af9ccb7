"""``fed-auc dashboard``: Streamlit over a runs directory, as a child process that never
outlives the command."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fed_auc.cli.dashboard_auth import Settings


def add_dashboard_parser(sub: argparse._SubParsersAction) -> None:
    dashboard = sub.add_parser("dashboard", help="open the Streamlit dashboard over a run store")
    dashboard.add_argument("--config", help="TOML file with these settings and [oidc]")
    dashboard.add_argument("--runs-dir", help="default: runs")
    dashboard.add_argument("--port", type=int, help="default: 8501")
    dashboard.add_argument(
        "--host", help="address to listen on (default 127.0.0.1; others need --auth oidc)"
    )
    dashboard.add_argument(
        "--auth", choices=["none", "oidc"],
        help="oidc: sign in through the hospital's OpenID Connect provider ([oidc] in --config)",
    )  # fmt: skip
    dashboard.add_argument(
        "--access-file", help="TOML naming who may open it, and their role (with --auth oidc)"
    )
    dashboard.add_argument(
        "--audit-log", help="sign-ins, refusals, sign-outs (default dashboard-audit.log)"
    )
    dashboard.add_argument(
        "--allowed-host", action="append", dest="allowed_hosts", metavar="NAME",
        help="a host name it is served under (repeatable); other Host headers are refused",
    )  # fmt: skip
    dashboard.add_argument(
        "--insecure-public", action="store_true",
        help="serve a non-loopback address without sign-in (only behind a signing-in proxy)",
    )  # fmt: skip


def dashboard_command(args: argparse.Namespace) -> int:
    from fed_auc.cli.dashboard_auth import settings

    return dashboard(settings(args))


def dashboard(config: Settings) -> int:
    """``streamlit run app/streamlit_app.py``, headless, no usage statistics; the runs
    directory travels in FED_AUC_RUNS_DIR. The app ships in the wheel beside ``fed_auc``.
    With ``auth = "oidc"`` the access file and audit log travel in the environment too, and
    the provider in a secrets file of this launch's own, removed when it ends.

    Every Streamlit setting that decides who someone is or what may reach the app is fixed
    here (``FIXED``), whatever the caller's environment, ``~/.streamlit`` or ``./.streamlit``
    say: Streamlit runs with no STREAMLIT_* variable, in a private HOME and working directory
    of this launch (removed when it ends), and with these settings as flags.

    SIGTERM, SIGINT and SIGHUP are passed on to Streamlit and waited for, and Streamlit is
    told by the kernel to stop if this process dies anyway: it never outlives the command."""
    import importlib.util
    import tempfile

    script = Path(__file__).resolve().parents[2] / "app" / "streamlit_app.py"
    if not script.exists():
        raise SystemExit(f"fed-auc dashboard: no app at {script} (this installation lacks app/)")
    if importlib.util.find_spec("streamlit") is None:  # before printing a URL nothing serves
        raise SystemExit(
            "fed-auc dashboard needs the dashboard extra (streamlit is missing): "
            "pip install -c constraints.txt -e '.[dashboard]'"
        )
    private = Path(tempfile.mkdtemp(prefix="fed-auc-dashboard-launch-"))  # mode 0700
    try:
        return _launch(config, script, private)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _launch(config: Settings, script: Path, private: Path) -> int:
    from app.access import ALLOWED_HOSTS_ENV
    from fed_auc.cli.dashboard_auth import OPEN_ENDPOINTS, write_secrets

    runs_dir, host, port = config.runs_dir, config.host, config.port
    env = _environment(private)
    env["FED_AUC_RUNS_DIR"] = str(Path(runs_dir).resolve())
    env[ALLOWED_HOSTS_ENV] = ",".join(config.hosts())  # the app checks them too
    command = [
        sys.executable, "-m", "streamlit", "run", str(script),
        "--server.headless", "true", "--server.port", str(port), "--server.address", host,
        "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal",
        *[flag for name, value in FIXED.items() for flag in (f"--{name}", value)],
        *[flag for name in config.hosts() for flag in ("--server.allowedHosts", name)],
    ]  # fmt: skip
    secrets_dir = None
    if config.auth == "oidc":
        env["FED_AUC_ACCESS_FILE"] = str(_access_file(config.access_file))
        env["FED_AUC_AUDIT_LOG"] = str(_audit_log(config.audit_log, runs_dir))
        secrets_dir = write_secrets(config.oidc)
        command += ["--secrets.files", str(secrets_dir / "secrets.toml")]
        state = f"sign-in through {config.oidc['server_metadata_url']}"
    else:
        command += ["--secrets.files", str(private / "secrets.toml")]  # empty: no [auth]
        state = "UNAUTHENTICATED: anyone who reaches this address sees every run"
        if config.insecure_public:
            env["FED_AUC_INSECURE_PUBLIC"] = "1"  # the app serves a non-loopback bind
            print(
                f"fed-auc dashboard: WARNING: serving {host} without sign-in (--insecure-public)"
                ": only safe behind a proxy that signs people in (hospitals/README.md)",
                file=sys.stderr,
            )
    hosts = ", ".join(config.hosts())
    print(f"fed-auc dashboard: http://{host}:{port} over {runs_dir}, {state}", file=sys.stderr)
    print(f"fed-auc dashboard: answers Host {hosts} only", file=sys.stderr)
    print(f"fed-auc dashboard: open without sign-in: {OPEN_ENDPOINTS}", file=sys.stderr)
    try:
        return _serve(command, env, private / "work")
    finally:
        if secrets_dir is not None:
            shutil.rmtree(secrets_dir, ignore_errors=True)


# Streamlit settings that decide who someone is or who may drive the app, fixed on every
# launch as flags. Lists that must stay empty have no flag that empties them: they are written
# into the private working directory's .streamlit/config.toml (``FIXED_LISTS``), which nothing
# else configures (no STREAMLIT_* variable, a private HOME).
FIXED_LISTS = (
    "[server]\ncorsAllowedOrigins = []\nunsafeMetricsUserAttributes = []\n"
    "[client]\nallowedOrigins = []\n"  # no other site's frame may drive the app by postMessage
)
FIXED = {
    "server.trustedUserHeaders": "{}",  # identity from request headers anyone can send
    "server.enableAgentApi": "false",  # a non-browser client driving the app over HTTP
    "server.enableXsrfProtection": "true",
    "server.enableCORS": "true",
    "server.xsrfCookieSameSite": "lax",
    "server.enableStaticServing": "false",
    "server.runOnSave": "false",
    "server.allowRunOnSave": "false",
    "global.developmentMode": "false",
}


def _environment(private: Path) -> dict[str, str]:
    """The caller's environment less every STREAMLIT_* variable and fed-auc's dashboard
    variables (sign-in, an open public address, allowed hosts: only this command sets them),
    with HOME (so ``~/.streamlit``) in ``private``; the user's site-packages stay importable."""
    import os
    import site

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith("STREAMLIT_")
        and k not in ("FED_AUC_ACCESS_FILE", "FED_AUC_AUDIT_LOG", "FED_AUC_INSECURE_PUBLIC")
        and k != "FED_AUC_ALLOWED_HOSTS"
    }
    env.setdefault("PYTHONUSERBASE", site.getuserbase())  # resolved from the real HOME
    if env.get("PYTHONPATH"):  # relative entries meant the caller's working directory
        parts = env["PYTHONPATH"].split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) if p else p for p in parts)
    (private / "home").mkdir()
    (private / "work" / ".streamlit").mkdir(parents=True)
    (private / "work" / ".streamlit" / "config.toml").write_text(FIXED_LISTS, encoding="utf-8")
    (private / "secrets.toml").touch(mode=0o600)
    env["HOME"] = str(private / "home")
    return env


def _access_file(path: str | None) -> Path:
    """The access file, checked before Streamlit starts (the app re-reads it on change)."""
    from app.access import AccessFileError, load

    try:
        load(str(path))
    except AccessFileError as e:
        raise SystemExit(f"fed-auc dashboard: {e}") from None
    return Path(str(path)).resolve()


def _audit_log(path: str, runs_dir: str) -> Path:
    resolved = Path(path).resolve()
    if resolved.is_relative_to(Path(runs_dir).resolve()):
        raise SystemExit(
            f"fed-auc dashboard: audit log {path} lies in the runs directory {runs_dir}: the "
            "dashboard never writes there; put it elsewhere (--audit-log)"
        )
    return resolved


def _serve(command: list[str], env: dict[str, str], cwd: Path) -> int:
    """Run Streamlit in ``cwd`` until it exits; signals passed on, never left behind."""
    import signal
    import subprocess

    process = subprocess.Popen(command, env=env, cwd=cwd, preexec_fn=_stop_with_parent)
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
