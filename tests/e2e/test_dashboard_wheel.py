"""The dashboard ships in the wheel: build it, install it into a fresh venv outside the
checkout (``--no-deps``; the dependencies come from this environment's site-packages, after
the wheel's own), start ``fed-auc dashboard`` there and render a page from the installed app."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from app.launch import start_dashboard
from tests.support.dashboard_store import fill
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow
SKIP = shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "runs", "__pycache__")


def test_the_wheel_carries_the_app_and_its_dashboard_starts(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=SKIP)
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(source),
        ],  # fmt: skip
        check=True,
        timeout=300,
    )
    (wheel,) = dist.glob("fed_auc-*.whl")
    env_dir = tmp_path / "fresh"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    packages = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()  # fmt: skip
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            str(wheel),
        ],  # fmt: skip
        check=True,
        timeout=300,
    )
    assert (packages / "app" / "streamlit_app.py").is_file()
    assert (packages / "app" / "views" / "operating_point.py").is_file()
    # the dependencies, behind the wheel's own packages (and not this checkout's fed_auc)
    (packages / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    runs = tmp_path / "runs"
    fill(runs)
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    where = subprocess.check_output(
        [python, "-c", "import app, fed_auc; print(app.__file__); print(fed_auc.__file__)"],
        cwd=away, env=env, text=True,
    ).split()  # fmt: skip
    assert all(Path(p).is_relative_to(packages) for p in where), where

    render = (
        "from streamlit.testing.v1 import AppTest; import app, pathlib, os, streamlit.config;"
        "streamlit.config.set_option('server.address', '127.0.0.1');"
        f"os.environ['FED_AUC_RUNS_DIR'] = {str(runs)!r};"
        "at = AppTest.from_file(str(pathlib.Path(app.__file__).parent / 'streamlit_app.py'),"
        " default_timeout=60).run(); assert not at.exception, at.exception;"
        "print(at.title[0].value)"
    )
    out = subprocess.check_output([python, "-c", render], cwd=away, env=env, text=True)
    assert out.strip().endswith("Overview")

    process, _ = start_dashboard(runs, command=[env_dir / "bin" / "fed-auc"], cwd=away, env=env)
    try:
        (child,) = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
        command = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        assert str(packages / "app" / "streamlit_app.py").encode() in command
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0
        process.stderr.close()
