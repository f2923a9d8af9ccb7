"""Faults explained in one line, on the console of the role that can act (no traceback).

``simulate``: a batch larger than a site's training split, a bad site file, a SIGTERM mid-run.
The node's and the coordinator's faults: ``tests/test_flower_faults.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fed_auc.cli import main
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.node.setup import check_batch_size
from fed_auc.simulation import build_federation
from fed_auc.site import SiteDefinition
from fed_auc.store.run_store import RunStore
from tests.support.paths import ROOT

HOSPITALS = ROOT / "hospitals"


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "fed_auc.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def test_a_batch_larger_than_a_sites_training_split_is_refused_before_the_run(tmp_path):
    config = ExperimentConfig(runs_dir=str(tmp_path), sites=2, data_scale=0.2, batch_size=10**6)
    with pytest.raises(ValueError, match=r"batch size 1000000 is larger than its training split"):
        build_federation(config)
    assert not (tmp_path / "fed_auc.sqlite").exists()  # no run was created


def test_the_batch_refusal_names_the_site_file_its_training_n_and_the_batch():
    site = SiteDefinition.from_toml(HOSPITALS / "mercy_rural.toml")
    data = site.load(28)
    with pytest.raises(ValueError) as refused:
        check_batch_size(data, 1_000_000)
    message = str(refused.value)
    assert "'mercy_rural'" in message and "mercy_rural.toml" in message
    assert f"({len(data.train)} images)" in message and "1000000" in message
    check_batch_size(data, len(data.train))  # the whole split is a valid batch


def test_simulate_refuses_a_huge_batch_in_one_line(tmp_path, capsys):
    site = str(HOSPITALS / "mercy_rural.toml")
    with pytest.raises(SystemExit) as stop:
        main(["simulate", "--site", site, "--batch-size", "1000000", "--runs-dir", str(tmp_path)])
    assert "fed-auc simulate: site 'mercy_rural'" in str(stop.value.code)
    assert "training split (150 images)" in str(stop.value.code)


def test_a_bad_site_file_ends_simulate_with_its_message_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[data]\nspec = "medmnist:missing.npz"\n')
    done = _cli("simulate", "--site", str(bad), "--rounds", "1", "--runs-dir", str(tmp_path))
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert f"fed-auc simulate: {bad}: medmnist file" in done.stderr
    assert "missing.npz not found" in done.stderr


def _stores_a_round(runs: Path) -> bool:
    if not (runs / "fed_auc.sqlite").exists():
        return False
    with RunStore(runs) as store:
        frame = store.runs()
        return not frame.empty and not store.rounds(frame["id"].iloc[0]).empty


def _ctrl_c_as_in_a_terminal() -> None:
    """SIGINT handled as in a terminal: a test run started in the background by a shell
    without job control inherits SIGINT ignored, and Python then never raises Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_simulate_marks_its_run_failed_and_says_how_to_resume(tmp_path, stop):
    runs = tmp_path / "runs"
    config = tmp_path / "small.toml"
    config.write_text("sites = 2\nrounds = 200\nlocal_steps = 1\ndata_scale = 0.2\n")
    command = [sys.executable, "-m", "fed_auc.cli", "simulate", "--config", str(config)]
    command += ["--runs-dir", str(runs)]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=os.environ,
        preexec_fn=_ctrl_c_as_in_a_terminal,
    )
    try:
        deadline = time.monotonic() + 120
        while not _stores_a_round(runs):
            assert process.poll() is None, process.stderr.read()
            assert time.monotonic() < deadline, "no round recorded"
            time.sleep(0.1)
        process.send_signal(stop)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130
    assert "Traceback" not in err
    with RunStore(runs) as store:
        run = store.runs().iloc[0]
        assert store.run(run["id"])["status"] == "failed"
        events = store.events(run["id"])["message"].tolist()
    assert any("stopped by the operator" in e for e in events)
    assert f"run {run['id']} is marked failed" in err
    assert f"`fed-auc simulate --resume {run['id']} --runs-dir {runs}`" in err
