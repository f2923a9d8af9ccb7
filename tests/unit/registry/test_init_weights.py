"""``--init``: starting weights mapped onto fed-auc's DenseNet, nothing loaded or left out
silently, nothing unpickled."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.common.weight_files import densenet_file
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.models import INPUTS, build_model, model_from_config
from fed_auc.registry.init_weights import monai_name
from fed_auc.registry.weights import convert_weights
from fed_auc.run.initial import starting_point

CLASSIFIER = ["net.class_layers.out.weight", "net.class_layers.out.bias"]


def start_from(path: Path, tmp_path: Path, **options):
    config = ExperimentConfig(init=str(path), runs_dir=str(tmp_path / "runs"), **options)
    return config, starting_point(config, config.num_labels, None)


def fresh_classifier(config: ExperimentConfig, input_norm: str) -> dict[str, torch.Tensor]:
    """The classifier a seeded run builds before any file is loaded."""
    torch.manual_seed(config.seed)
    model = build_model(config.model, config.num_labels, norm=config.model_norm(),
                        input_norm=input_norm)  # fmt: skip
    return {n: model.state_dict()[n] for n in CLASSIFIER}


@pytest.mark.parametrize(("xrv", "channels", "outputs"), [(False, 3, 1000), (True, 1, 18)])
def test_torchvision_and_xrv_names_map_with_channel_sum_and_fresh_classifier(
    tmp_path: Path, xrv: bool, channels: int, outputs: int
) -> None:
    weights = densenet_file("tiny", outputs, channels, xrv=xrv)
    path = tmp_path / "densenet.pth"
    torch.save(weights, path)
    config, start = start_from(path, tmp_path)
    assert config.model == "tiny"  # the network comes from the file
    loaded = start.model.state_dict()
    conv0 = weights["features.conv0.weight"]
    torch.testing.assert_close(loaded["net.features.conv0.weight"], conv0.sum(1, keepdim=True),
                               rtol=0, atol=0)  # fmt: skip
    features = [k for k in weights if k.startswith("features.") and k != "features.conv0.weight"]
    for name in features:
        assert torch.equal(loaded[monai_name(name, "torchvision")], weights[name]), name
    for name, value in fresh_classifier(config, start.report["input"]).items():
        assert torch.equal(loaded[name], value), name
    report = start.report
    assert report["format"] == ("torchxrayvision" if xrv else "torchvision")
    assert report["input"] == ("xrv" if xrv else "imagenet")
    assert report["converted"] == ([] if xrv else ["features.conv0.weight"])
    assert report["loaded"] == [k for k in weights if k.startswith("features.")
                                and k not in report["converted"]]  # fmt: skip
    extra = ["op_threshs"] if xrv else []
    assert report["replaced"] == ["classifier.weight", "classifier.bias", *extra]
    assert report["initialized"] == CLASSIFIER
    assert len(report["sha256"]) == 64


def test_input_normalization_is_part_of_the_model() -> None:
    torch.manual_seed(0)
    plain = build_model("tiny").eval()
    imagenet = build_model("tiny", input_norm="imagenet").eval()
    imagenet.load_state_dict(plain.state_dict())
    x = torch.rand(2, 1, 32, 32)
    mean, std = INPUTS["imagenet"]
    torch.testing.assert_close(imagenet(x), plain((x - mean) / std))
    rebuilt = model_from_config(imagenet.config())  # what an exported model is rebuilt from
    assert imagenet.config()["input"] == "imagenet" and rebuilt.input_norm == "imagenet"
    assert "input" not in plain.config()  # configs recorded before stay as they were


def test_monai_state_dict_and_safetensors_keep_everything(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(3)
    source = build_model("tiny")
    path = tmp_path / "monai.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    _, start = start_from(path, tmp_path)
    for name, value in source.state_dict().items():
        assert torch.equal(start.model.state_dict()[name], value), name
    assert start.report["initialized"] == [] and start.report["input"] == "unit"
    assert start.report["classifier"].startswith("kept")


def refused(path: Path, tmp_path: Path, match: str) -> None:
    runs = tmp_path / "runs"
    with pytest.raises(ValueError, match=match) as caught:
        from fed_auc.simulation import run_simulation

        run_simulation(ExperimentConfig(init=str(path), runs_dir=str(runs), model="tiny",
                                        rounds=1, sites=2, data_scale=0.1))  # fmt: skip
    assert str(path) in str(caught.value)
    assert not (runs / "fed_auc.sqlite").exists()  # nothing written for a refused run


def test_truncated_files_are_refused_naming_the_file_and_key(tmp_path: Path) -> None:
    weights = densenet_file("tiny", 1000, 3)
    cut = tmp_path / "cut.pth"
    torch.save(weights, cut)
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    refused(cut, tmp_path, "cannot be read")
    missing = tmp_path / "missing.pth"
    dropped = "features.denseblock2.denselayer1.conv1.weight"
    torch.save({k: v for k, v in weights.items() if k != dropped}, missing)
    refused(missing, tmp_path, "no tensor for the model's 'net.features.denseblock2.denselayer1"
                               r"\.layers\.conv1\.weight'")  # fmt: skip


def test_another_architecture_is_refused_naming_the_key(tmp_path: Path) -> None:
    weights = densenet_file("tiny", 1000, 3)
    weights["features.transition1.conv.weight"] = torch.zeros(16, 30, 1, 1)
    path = tmp_path / "other.pth"
    torch.save(weights, path)
    refused(path, tmp_path, r"'features\.transition1\.conv\.weight' has shape \(16, 30, 1, 1\)")


def test_pickled_module_is_refused_then_converted(tmp_path: Path) -> None:
    torch.manual_seed(4)
    module = build_model("tiny")
    pickled = tmp_path / "module.pt"
    torch.save(module, pickled)
    refused(pickled, tmp_path, r"pickled code \(.*DenseNetClassifier.*convert-weights")
    converted = tmp_path / "module.safetensors"
    said = convert_weights(pickled, converted)
    assert "DenseNetClassifier" in said and str(converted) in said
    _, start = start_from(converted, tmp_path)
    for name, value in module.state_dict().items():
        assert torch.equal(start.model.state_dict()[name], value), name
    with pytest.raises(ValueError, match="exists"):
        convert_weights(pickled, converted)


def test_commands_refuse_a_pickled_file_and_convert_it(tmp_path: Path, capsys) -> None:
    from fed_auc.cli import main
    from fed_auc.cli.federation import check_init

    pickled = tmp_path / "module.pt"
    torch.save(build_model("tiny"), pickled)
    runs = tmp_path / "runs"
    with pytest.raises(SystemExit, match=f"fed-auc simulate: .*{pickled}.*convert-weights"):
        main(["simulate", "--init", str(pickled), "--model", "tiny", "--runs-dir", str(runs)])
    with pytest.raises(SystemExit, match=f"fed-auc coordinator: .*{pickled}.*pickled code"):
        check_init({"init": str(pickled), "model": "tiny", "transport": "flower"})
    assert not runs.exists()
    assert main(["convert-weights", str(pickled), str(tmp_path / "w.pt")]) == 0
    said = capsys.readouterr().out
    assert f"{len(build_model('tiny').state_dict())} tensors" in said and "w.pt" in said
    check_init({"init": str(tmp_path / "w.pt"), "model": "tiny", "transport": "flower"})


def test_old_torchvision_layer_names_map_as_monai_maps_them() -> None:
    old = "features.denseblock3.denselayer2.norm.1.running_var"  # torchvision before 0.3
    new = "features.denseblock3.denselayer2.conv2.weight"
    assert monai_name(old, "torchvision") == (
        "net.features.denseblock3.denselayer2.layers.norm1.running_var"
    )
    assert (
        monai_name(new, "torchvision") == "net.features.denseblock3.denselayer2.layers.conv2.weight"
    )
    assert monai_name("classifier.weight", "torchxrayvision") is None  # replaced, listed
    assert monai_name("features.transition2.conv.weight", "torchvision") == (
        "net.features.transition2.conv.weight"
    )


def test_an_init_in_an_experiment_file_is_relative_to_that_file(tmp_path: Path, monkeypatch):
    """simulate and coordinator read experiment files alike: ``init = "weights.pt"`` is the
    file beside the config, wherever the command runs from."""
    import argparse

    from fed_auc.cli.experiment_options import config_from_args
    from fed_auc.experiment.files import load_experiment

    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "weights.pt").write_bytes(b"")  # only its place matters here
    (folder / "sim.toml").write_text('init = "weights.pt"\nmodel = "tiny"\n')
    flower = '\n[flower]\ninsecure = true\n'
    (folder / "fl.toml").write_text('init = "weights.pt"\nmodel = "tiny"' + flower)
    monkeypatch.chdir(tmp_path)  # not the config's folder
    args = argparse.Namespace(
        config=folder / "sim.toml", sites_dir=None, sites=None, backend_option=None
    )
    expected = str((folder / "weights.pt").resolve())
    assert config_from_args(args).init == expected
    assert load_experiment(folder / "fl.toml", {})["experiment"]["init"] == expected
