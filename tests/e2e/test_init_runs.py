"""Runs started with ``--init``: from a registered model (its AUC at round 0, exactly), from an
ImageNet-named file (the card says what it got), and resumed after a stop."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from benchmarks.common.weight_files import densenet_file
from benchmarks.reliability.faults import rounds_in
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.registry.load import load_registered_model
from fed_auc.registry.register import register_model
from fed_auc.simulation import resume_simulation, run_simulation
from fed_auc.store.run_store import RunStore
from tests.e2e.test_resume import final_model
from tests.support.processes import slowed_fed_auc_args

OPTIONS = {"sites": 3, "local_steps": 2, "seed": 5, "data_scale": 0.3, "select": "last"}


@pytest.fixture(scope="module")
def registered(tmp_path_factory) -> tuple[Path, dict]:
    """A 2-round federation registered as models/first."""
    root = tmp_path_factory.mktemp("registered")
    summary = run_simulation(ExperimentConfig(runs_dir=str(root / "runs"), rounds=2, **OPTIONS))
    return register_model(Path(summary["model_path"]).parent, "first", root / "models"), summary


def test_init_from_a_registered_model_starts_at_its_auc(
    tmp_path: Path, registered: tuple[Path, dict]
) -> None:
    folder, first = registered
    card = json.loads((folder / "model_card.json").read_text())
    config = ExperimentConfig(runs_dir=str(tmp_path), rounds=1, init=str(folder), **OPTIONS)
    second = run_simulation(config)
    assert second["global_auc"][0] == card["global_auc"] == first["global_auc"][-1]
    exported, new_card = load_registered_model(second["model_path"])
    assert new_card["init"]["format"] == "fed-auc"
    # an export keeps the float tensors only: BatchNorm's step counters start again
    assert new_card["init"]["initialized"]
    assert all(n.endswith("num_batches_tracked") for n in new_card["init"]["initialized"])
    assert new_card["init"]["auc_variables"] == ["a", "alpha", "b"]  # a, b, α continue too


def test_registered_model_for_another_image_size_is_refused(
    tmp_path: Path, registered: tuple[Path, dict]
) -> None:
    folder, _ = registered
    config = ExperimentConfig(runs_dir=str(tmp_path), rounds=1, init=str(folder),
                              image_size=32, **OPTIONS)  # fmt: skip
    with pytest.raises(
        ValueError, match=r"its image size is 28, the experiment's \(image_size\) 32"
    ):
        run_simulation(config)
    assert not (tmp_path / "fed_auc.sqlite").exists()


@pytest.fixture(scope="module")
def imagenet_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("imagenet") / "densenet.pth"
    torch.save(densenet_file("tiny", 1000, 3), path)
    return path


@pytest.fixture(scope="module")
def whole(tmp_path_factory, imagenet_file: Path) -> dict:
    """The uninterrupted 4-round run from the ImageNet-named file."""
    runs = tmp_path_factory.mktemp("whole")
    options = {**OPTIONS, "rounds": 4, "init": str(imagenet_file)}
    return run_simulation(ExperimentConfig(runs_dir=str(runs), **options))


def test_stopped_init_run_resumes_to_the_uninterrupted_model(
    tmp_path: Path, imagenet_file: Path, whole: dict
) -> None:
    options = {**OPTIONS, "rounds": 4, "init": str(imagenet_file)}

    def stop_after_two(record) -> None:
        if record.round == 2:
            raise KeyboardInterrupt  # as Ctrl-C or SIGTERM stops `fed-auc simulate`

    runs = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        run_simulation(ExperimentConfig(runs_dir=str(runs), **options), stop_after_two)
    with RunStore(runs) as store:
        run_id = store.runs()["id"].iloc[0]
        assert store.run(run_id)["status"] == "failed"
    resumed = resume_simulation(runs, run_id)
    assert resumed["global_auc"] == whole["global_auc"]
    for name, tensor in final_model(whole).items():
        torch.testing.assert_close(final_model(resumed)[name], tensor, rtol=1e-5, atol=1e-6)
    model, card = load_registered_model(resumed["model_path"])
    assert model.input_norm == "imagenet" and card["init"]["input"] == "imagenet"
    assert card["init"]["converted"] == ["features.conv0.weight"]
    assert (
        "## Starting weights" in (Path(resumed["model_path"]).parent / "MODEL_CARD.md").read_text()
    )


@pytest.mark.slow
def test_sigkilled_init_run_resumes_to_the_uninterrupted_model(
    tmp_path: Path, imagenet_file: Path, whole: dict
) -> None:
    config = tmp_path.parent / f"{tmp_path.name}.toml"
    options = {**OPTIONS, "rounds": 4}
    config.write_text("".join(f"{key} = {json.dumps(value)}\n" for key, value in options.items()))
    args = slowed_fed_auc_args("simulate", "--config", str(config), "--init", str(imagenet_file),
                               "--runs-dir", str(tmp_path), site_delay_s=0.2)  # fmt: skip
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while rounds_in(tmp_path) < 2:
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline, "the run did not reach round 2"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.stderr.close()
    assert rounds_in(tmp_path) < 4, "killed after the last round: not mid-run"
    with RunStore(tmp_path) as store:
        run_id = store.runs()["id"].iloc[0]
    resumed = resume_simulation(tmp_path, run_id)
    assert resumed["global_auc"] == whole["global_auc"]
    for name, tensor in final_model(whole).items():
        torch.testing.assert_close(final_model(resumed)[name], tensor, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def plain_start(tmp_path_factory, imagenet_file: Path) -> dict:
    runs = tmp_path_factory.mktemp("plain")
    return run_simulation(ExperimentConfig(runs_dir=str(runs), rounds=1, init=str(imagenet_file),
                                           **OPTIONS))  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [{"partial_training": True}, {"personalize": "head"}, {"secure_aggregation": True}],
    ids=["partial", "personal", "secure"],
)
def test_init_start_works_with_partial_personal_and_secure_runs(
    tmp_path: Path, imagenet_file: Path, plain_start: dict, options: dict
) -> None:
    config = ExperimentConfig(runs_dir=str(tmp_path), rounds=1, init=str(imagenet_file),
                              **OPTIONS, **options)  # fmt: skip
    summary = run_simulation(config)
    assert summary["global_auc"][0] == plain_start["global_auc"][0]  # the same round-0 model
    _, card = load_registered_model(summary["model_path"])
    assert card["init"]["converted"] == ["features.conv0.weight"]


def test_init_start_under_dp_sgd_loads_norm_scales_not_batch_statistics(
    tmp_path: Path, imagenet_file: Path
) -> None:
    config = ExperimentConfig(runs_dir=str(tmp_path), rounds=1, init=str(imagenet_file),
                              dp="example", dp_clip=1.0, dp_noise=1.0, **OPTIONS)  # fmt: skip
    summary = run_simulation(config)
    model, card = load_registered_model(summary["model_path"])
    assert model.norm == "group"
    statistics = [n for n in card["init"]["replaced"] if n.startswith("features.")]
    assert statistics and all(n.endswith(("running_mean", "running_var", "num_batches_tracked"))
                              for n in statistics)  # fmt: skip
    assert "features.norm0.weight" in card["init"]["loaded"]
    assert card["privacy"]["sites"]  # the accountant ran as in any DP-SGD run
