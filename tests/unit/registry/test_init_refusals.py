"""``--init`` files that would start a run silently wrong, or end it in a traceback, are refused
before the run exists, each with one line naming the file and what is wrong: a model for
another positive class (in-process and over the Flower coordinator's path, one check), a
tensor of another shape, and bytes that are no weights file at all."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.common.weight_files import densenet_file
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.experiment.files import load_experiment
from fed_auc.simulation import run_simulation
from fed_auc.site import SiteDefinition
from fed_auc.store.run_store import RunStore
from fed_auc.transport.flower import server
from fed_auc.transport.flower.worker import NodeWorker
from tests.support.data_files import write_npz
from tests.support.flower_like import FlowerLikeTransport

QUICK = {"model": "tiny", "rounds": 1, "local_steps": 1, "batch_size": 8, "image_size": 16,
         "warmup_rounds": 0}  # fmt: skip


def _site_files(root: Path, data: str) -> list[Path]:
    """Two BreastMNIST-like sites on small npz files; ``data``: extra ``[data]`` lines."""
    files = []
    root.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(("north", "south")):
        npz = write_npz(root / f"{name}.npz", n=(24, 8, 8), seed=index + 1)
        path = root / f"{name}.toml"
        path.write_text(
            f'name = "{name}"\n\n[data]\nspec = "medmnist:{npz}"\n{data}\n'
            f'[node]\nstate_dir = "{root / "state" / name}"\nindex = {index}\n'
        )
        files.append(path)
    return files


@pytest.fixture(scope="module")
def malignant_model(tmp_path_factory) -> Path:
    """A model trained with the files' 0 as the positive class ("malignant")."""
    root = tmp_path_factory.mktemp("malignant")
    files = _site_files(root, 'positive_label = 0\npositive_class = "malignant"\n')
    config = ExperimentConfig(site_files=[str(f) for f in files], runs_dir=str(root / "runs"),
                              **QUICK)  # fmt: skip
    return Path(run_simulation(config)["model_path"]).parent


PRIOR_CLASS = r"positive class 'malignant', the sites' is 'label == 1'"


def test_a_model_for_another_positive_class_is_refused_in_process(
    tmp_path: Path, malignant_model: Path
) -> None:
    files = [str(f) for f in _site_files(tmp_path / "sites", "")]  # the files' 1 is positive
    runs = tmp_path / "runs"
    for init in (malignant_model, malignant_model / "model.pt"):
        config = ExperimentConfig(site_files=files, runs_dir=str(runs), init=str(init), **QUICK)
        with pytest.raises(ValueError, match=PRIOR_CLASS) as caught:
            run_simulation(config)
        assert str(malignant_model) in str(caught.value)
        assert "positive_class = 'malignant'" in str(caught.value)  # how to proceed
    assert not (runs / "fed_auc.sqlite").exists()  # a refused file records nothing


def test_a_copied_model_file_keeps_its_positive_class(tmp_path: Path, malignant_model: Path):
    """model.pt alone (its card left behind) still says which class it scores."""
    alone = tmp_path / "alone" / "model.pt"
    alone.parent.mkdir()
    alone.write_bytes((malignant_model / "model.pt").read_bytes())
    files = [str(f) for f in _site_files(tmp_path / "sites", "")]
    config = ExperimentConfig(site_files=files, runs_dir=str(tmp_path / "runs"),
                              init=str(alone), **QUICK)  # fmt: skip
    with pytest.raises(ValueError, match=PRIOR_CLASS):
        run_simulation(config)


def test_the_same_class_under_the_models_name_is_accepted(tmp_path: Path, malignant_model: Path):
    files = _site_files(tmp_path / "sites", 'positive_label = 0\npositive_class = "malignant"\n')
    config = ExperimentConfig(site_files=[str(f) for f in files], runs_dir=str(tmp_path / "runs"),
                              init=str(malignant_model), **QUICK)  # fmt: skip
    assert run_simulation(config)["global_auc"][0] is not None


def test_a_model_for_another_positive_class_is_refused_by_the_coordinator(
    tmp_path: Path, malignant_model: Path
) -> None:
    """``fed-auc coordinator --init``: checked once the sites register (their positive class is
    known only then), by the same check; the run is marked failed with the message."""
    files = _site_files(tmp_path / "sites", "")
    workers = {SiteDefinition.from_toml(f).name: NodeWorker(SiteDefinition.from_toml(f))
               for f in files}  # fmt: skip
    path = tmp_path / "experiment.toml"
    lines = [f"{k} = {v!r}".replace("'", '"') for k, v in QUICK.items()]
    path.write_text(
        "\n".join(lines) + f'\ninit = "{malignant_model}"\nruns_dir = "{tmp_path / "runs"}"\n'
        "\n[flower]\nexpected_sites = 2\nmin_nodes = 2\ninsecure = true\n"
    )
    experiment = load_experiment(path, {})
    config = experiment["experiment"]
    with RunStore(config["runs_dir"]) as store:  # as fed-auc coordinator creates it
        experiment["run_id"] = store.create_run(config["algorithm"], dict(config), None)
    with pytest.raises(ValueError, match=PRIOR_CLASS):
        server.run_experiment(
            None,
            experiment,
            lambda line: None,
            lambda g, setup, *a: FlowerLikeTransport(files, setup, workers),
        )
    with RunStore(config["runs_dir"]) as store:
        run = store.run(experiment["run_id"])
        assert run["status"] == "failed"
        assert "positive class 'malignant'" in run["summary"]["error"]  # what the run says
        assert store.rounds(experiment["run_id"]).empty  # no round 0 with inverted scores


# -- shapes --------------------------------------------------------------------------------
def _refused(path: Path, tmp_path: Path, match: str) -> str:
    config = ExperimentConfig(init=str(path), runs_dir=str(tmp_path / "runs"), model="tiny",
                              rounds=1, sites=2, data_scale=0.1)  # fmt: skip
    with pytest.raises(ValueError, match=match) as caught:
        run_simulation(config)
    assert str(path) in str(caught.value)
    assert not (tmp_path / "runs" / "fed_auc.sqlite").exists()
    return str(caught.value)


def test_a_first_convolution_of_another_kernel_size_is_refused_naming_both_shapes(tmp_path):
    weights = densenet_file("tiny", 1000, 3)
    out_channels = weights["features.conv0.weight"].shape[0]
    weights["features.conv0.weight"] = torch.zeros(out_channels, 3, 5, 5)  # ImageNet's is 7×7
    path = tmp_path / "conv5.pth"
    torch.save(weights, path)
    _refused(path, tmp_path, rf"tensor 'features\.conv0\.weight' has shape \({out_channels}, 3, "
                             rf"5, 5\), the tiny model's 'net\.features\.conv0\.weight' "
                             rf"\({out_channels}, 1, 7, 7\)")  # fmt: skip


def test_a_gray_first_convolution_of_another_width_is_refused(tmp_path):
    weights = densenet_file("tiny", 18, 1, xrv=True)
    conv0 = weights["features.conv0.weight"]
    weights["features.conv0.weight"] = torch.zeros(conv0.shape[0], 1, 3, 3)
    path = tmp_path / "conv3.pth"
    torch.save(weights, path)
    _refused(path, tmp_path, r"'features\.conv0\.weight' has shape \(\d+, 1, 3, 3\), .*7, 7\)")


def test_a_first_convolution_of_another_width_names_the_tensor_and_the_known_networks(tmp_path):
    weights = densenet_file("tiny", 1000, 3)
    weights["features.conv0.weight"] = torch.zeros(24, 3, 7, 7)  # tiny has 16, small 32
    path = tmp_path / "wide.pth"
    torch.save(weights, path)
    said = _refused(path, tmp_path, "a DenseNet with 24 initial features")
    assert "features.conv0.weight has shape (24, 3, 7, 7)" in said
    assert "'tiny': (16, (2, 2, 2))" in said  # what fed-auc's networks expect


# -- not a weights file ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "kind"),
    [
        (os.urandom(5000), "5000 bytes that are not a torch file"),
        (b"", "0 bytes"),
        (b"hello, world\n" * 40, "520 bytes that are not a torch file"),
    ],
    ids=["random", "empty", "text"],
)
def test_bytes_that_are_no_weights_file_are_not_called_pickled_code(tmp_path, content, kind):
    path = tmp_path / "weights.pt"
    path.write_bytes(content)
    said = _refused(path, tmp_path, "cannot be read")
    assert kind in said
    assert "pickled code" not in said and "convert-weights" not in said
    assert ".safetensors" in said and "registered model" in said  # what --init takes


def test_a_truncated_torch_file_is_called_one(tmp_path):
    path = tmp_path / "cut.pth"
    torch.save(densenet_file("tiny", 1000, 3), path)
    path.write_bytes(path.read_bytes()[:4000])
    said = _refused(path, tmp_path, "cannot be read")
    assert "a torch file (zip), truncated or damaged" in said and "pickled code" not in said


def test_a_plain_pickle_without_classes_is_not_called_code(tmp_path):
    import pickle

    path = tmp_path / "numbers.pkl"
    path.write_bytes(pickle.dumps({"a": np.arange(3).tolist()}, protocol=4))
    said = _refused(path, tmp_path, "cannot be read")
    assert "a Python pickle" in said and "pickled code" not in said
