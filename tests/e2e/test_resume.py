"""Crash and resume: a run killed with SIGKILL mid-round, resumed, equals the uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from benchmarks.reliability.faults import rounds_in  # the last round a runs folder recorded
from fed_auc.coordinator.checkpoint import load_checkpoint
from fed_auc.coordinator.errors import FederationError
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import load_torch, save_state
from fed_auc.simulation import resume_simulation, run_simulation
from fed_auc.store.run_store import RunStore
from tests.support.processes import slowed_fed_auc_args

ROUNDS = 6
OPTIONS = {"sites": 3, "rounds": ROUNDS, "local_steps": 2, "seed": 5, "data_scale": 0.4}
TIMING = {"duration_s", "finished_at", "time", "id"}


def comparable(frame: pd.DataFrame) -> pd.DataFrame:
    """A store table without wall-clock columns, timings inside metrics, the node's compute
    measurements (images/s, peak memory: the machine's, not the run's), or ROC points (whose
    number depends on exact score ties, which float tolerance does not preserve)."""
    frame = frame.drop(columns=[c for c in frame.columns if c in TIMING or c == "run_id"])
    if "metrics" in frame:
        frame["metrics"] = [
            {
                k: v
                for k, v in json.loads(m).items()
                if not k.endswith("_s") and k not in ("roc", "compute")
            }
            if m
            else m
            for m in frame["metrics"]
        ]
    return frame.reset_index(drop=True)


def final_model(summary: dict) -> dict[str, torch.Tensor]:
    exported = load_torch(summary["model_path"])
    return {**exported["state_dict"], **{f"auc/{k}": v for k, v in exported["auc"].items()}}


def assert_same_run(runs_a: Path, a: dict, runs_b: Path, b: dict) -> None:
    for name, tensor in final_model(a).items():
        torch.testing.assert_close(final_model(b)[name], tensor, rtol=1e-5, atol=1e-6)
    with RunStore(runs_a) as sa, RunStore(runs_b) as sb:
        for table in ("rounds", "site_rounds"):
            left = comparable(getattr(sa, table)(a["run_id"]))
            right = comparable(getattr(sb, table)(b["run_id"]))
            pd.testing.assert_frame_equal(left, right, rtol=1e-5, atol=1e-6)
        rounds = sb.rounds(b["run_id"])["round"].tolist()
        assert rounds == list(range(ROUNDS + 1))  # none lost, none duplicated
        assert sb.run(b["run_id"])["status"] == "completed"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, dict]:
    runs = tmp_path_factory.mktemp("uninterrupted")
    return runs, run_simulation(ExperimentConfig(runs_dir=str(runs), **OPTIONS))


def start_cli_run(runs: Path) -> subprocess.Popen:
    config = runs.parent / f"{runs.name}.toml"
    config.write_text("".join(f"{key} = {value}\n" for key, value in OPTIONS.items()))
    args = slowed_fed_auc_args(
        "simulate", "--config", str(config), "--runs-dir", str(runs), site_delay_s=0.2
    )
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ)


@pytest.mark.slow
@pytest.mark.parametrize("kill_seed", [0])
def test_sigkill_mid_round_then_resume_equals_uninterrupted(
    tmp_path: Path, uninterrupted: tuple[Path, dict], kill_seed: int
) -> None:
    process = start_cli_run(tmp_path)
    deadline = time.monotonic() + 600
    while rounds_in(tmp_path) < 2:  # let it commit a few rounds, then kill it mid-round
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline, "the run did not reach round 2"
        time.sleep(0.05)
    time.sleep(random.Random(kill_seed).uniform(0.0, 0.4))
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    before = rounds_in(tmp_path)
    assert 2 <= before < ROUNDS, f"killed after round {before}: not mid-run"

    with RunStore(tmp_path) as store:
        run_id = store.runs()["id"].iloc[0]
        assert store.run(run_id)["status"] == "running"  # as SIGKILL left it
    resumed = resume_simulation(tmp_path, run_id)
    assert_same_run(*uninterrupted, tmp_path, resumed)
    with RunStore(tmp_path) as store:
        events = store.events(run_id)["message"].tolist()
    assert f"run resumed after round {before}" in events


def test_resume_after_a_crash_between_checkpoint_and_record(
    tmp_path: Path, uninterrupted: tuple[Path, dict]
) -> None:
    """The checkpoint of round r is written before round r is recorded: a crash in between
    leaves checkpoint r and store r − 1; resume takes the kept previous checkpoint."""
    config = ExperimentConfig(runs_dir=str(tmp_path), **{**OPTIONS, "rounds": 3})
    first = run_simulation(config)
    run_dir = tmp_path / first["run_id"]
    with RunStore(tmp_path) as store:  # forget round 3 as if the crash came before its record
        store._conn.execute("DELETE FROM rounds WHERE round = 3")
        store._conn.execute("DELETE FROM site_rounds WHERE round = 3")
        store._conn.execute("UPDATE runs SET status = 'failed'")
        store._conn.execute("UPDATE runs SET config = ?", (json.dumps(config.to_dict()),))
    assert load_checkpoint(run_dir, 2)["round"] == 2  # the previous file
    resumed = resume_simulation(tmp_path, first["run_id"])
    assert resumed["global_auc"] == first["global_auc"]
    for name, tensor in final_model(first).items():
        torch.testing.assert_close(final_model(resumed)[name], tensor)


def test_resume_refuses_completed_unknown_and_uncheckpointed_runs(tmp_path: Path) -> None:
    config = ExperimentConfig(runs_dir=str(tmp_path), **{**OPTIONS, "rounds": 1})
    done = run_simulation(config)
    with pytest.raises(ValueError, match="already completed"):
        resume_simulation(tmp_path, done["run_id"])
    with pytest.raises(ValueError, match="no run 'nope'"):
        resume_simulation(tmp_path, "nope")
    with RunStore(tmp_path) as store:
        store._conn.execute("UPDATE runs SET status = 'failed'")
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        save_state({"round": 7, "state": {}, "accepted": {}}, tmp_path / done["run_id"] / name)
    with pytest.raises(FederationError, match="no checkpoint of it .*holds round 7"):
        resume_simulation(tmp_path, done["run_id"])


def test_cli_resume_refuses_other_options(tmp_path: Path) -> None:
    from fed_auc.cli import main

    with pytest.raises(SystemExit, match="drop --rounds"):
        main(["simulate", "--resume", "abc", "--rounds", "3", "--runs-dir", str(tmp_path)])


def test_cli_resume_of_an_unknown_run_creates_nothing_and_names_the_runs_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped runs dir or run id: no folder, no empty store; the runs that can be resumed
    are listed. ``fed-auc --threads 1`` (the guide's) is this machine's, not the run's."""
    from fed_auc.cli import main

    missing = tmp_path / "typo"
    with pytest.raises(SystemExit, match="no run store at .*typo.*--runs-dir"):
        main(["--threads", "1", "simulate", "--resume", "nope", "--runs-dir", str(missing)])
    assert not missing.exists()

    config = ExperimentConfig(runs_dir=str(tmp_path), **{**OPTIONS, "rounds": 1})
    done = run_simulation(config)["run_id"]
    with pytest.raises(SystemExit, match="it holds no run that can be resumed"):
        main(["simulate", "--resume", "nope", "--runs-dir", str(tmp_path)])
    with RunStore(tmp_path) as store:
        store._conn.execute("UPDATE runs SET status = 'failed'")
    with pytest.raises(SystemExit, match=f"no run 'nope' in .*latest first: {done}"):
        main(["--threads", "1", "simulate", "--resume", "nope", "--runs-dir", str(tmp_path)])
    assert main(["--threads", "1", "simulate", "--resume", done, "--runs-dir", str(tmp_path)]) == 0
    assert f"run {done}: " in capsys.readouterr().out
