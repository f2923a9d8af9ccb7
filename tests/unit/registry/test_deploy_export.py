"""``fed-auc export``: TorchScript, ONNX (onnxruntime) and a MONAI bundle (MONAI's bundle API)
each score as ``fed-auc evaluate`` does and carry the model card's facts; bad input is refused
in one line naming what and where."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from fed_auc.cli import main
from fed_auc.data.base import Split
from fed_auc.evaluate.local import score_sites
from fed_auc.exchange import MODEL_FORMAT
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import save_json, save_torch
from fed_auc.metrics.calibration import apply_calibration
from fed_auc.models import build_model
from fed_auc.node.compute import Compute
from fed_auc.registry.load import load_registered_model
from fed_auc.registry.weights import sha256
from fed_auc.simulation import run_simulation

TORCHSCRIPT_TOLERANCE = 1e-5  # max |score difference| to fed-auc evaluate's scores
ONNX_TOLERANCE = 1e-4  # onnxruntime and the MONAI bundle (same float32 ops, other kernels)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny model trained by a 2-round simulation (28 px: upsampled inside; flip TTA),
    exported to all three formats; (model folder, export folder)."""
    root = tmp_path_factory.mktemp("export")
    config = ExperimentConfig(runs_dir=str(root / "runs"), sites=3, rounds=2, local_steps=1,
                              batch_size=8, data_scale=0.15, tta="flip")  # fmt: skip
    model_dir = Path(run_simulation(config)["model_path"]).parent
    main(["export", str(model_dir), "--out", str(root / "deploy")])
    return model_dir, root / "deploy"


def _images(size: int, channels: int = 1, seed: int = 7) -> torch.Tensor:
    """Random images and a few structured ones (not the exporter's own check images)."""
    rand = torch.rand(9, channels, size, size, generator=torch.Generator().manual_seed(seed))
    ramp = torch.linspace(0, 1, size)
    fixed = torch.stack([torch.full((size, size), 0.5), ramp[None, :].expand(size, size),
                         torch.eye(size), torch.tril(torch.ones(size, size))])  # fmt: skip
    return torch.cat([rand, fixed[:, None].expand(-1, channels, -1, -1)]).contiguous()


def _evaluate_scores(model_dir: Path, images: torch.Tensor) -> np.ndarray:
    """What ``fed-auc evaluate`` scores for ``images``: its scoring function, the card's TTA."""
    model, card = load_registered_model(model_dir)
    labels = torch.zeros(len(images), len(card["label_names"]))
    split = {"s": Split(images, labels)}
    (_, scores), = score_sites(model, split, card.get("tta", "none"), Compute(torch.device("cpu"))).values()  # fmt: skip # noqa: E501
    return scores


def _torchscript(path: Path, images: torch.Tensor) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = torch.jit.load(str(path))
    with torch.no_grad():
        return module(images).numpy()


def _onnx(path: Path, images: torch.Tensor) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"image": images.numpy()})[0]


def _bundle(bundle: Path, images: torch.Tensor, tmp: Path) -> np.ndarray:
    """The bundle run by MONAI's own API (monai.bundle.run on its inference config)."""
    from monai.bundle import run

    np.save(tmp / "images.npy", images.numpy())
    run(config_file=str(bundle / "configs" / "inference.json"),
        meta_file=str(bundle / "configs" / "metadata.json"), bundle_root=str(bundle),
        input_file=str(tmp / "images.npy"), output_file=str(tmp / "scores.csv"))  # fmt: skip
    torch.set_grad_enabled(True)  # the bundle's initialize turns autograd off, as inference does
    return np.loadtxt(tmp / "scores.csv", delimiter=",", skiprows=1, ndmin=2)


def _check_all_formats(model_dir: Path, out: Path, images: torch.Tensor, tmp: Path) -> dict:
    expected = _evaluate_scores(model_dir, images)
    diffs = {
        "torchscript": np.abs(_torchscript(out / "model.ts", images) - expected).max(),
        "onnx": np.abs(_onnx(out / "model.onnx", images) - expected).max(),
        "onnx one image": np.abs(_onnx(out / "model.onnx", images[:1]) - expected[:1]).max(),
        "bundle": np.abs(_bundle(out / "bundle", images, tmp) - expected).max(),
    }
    print("max |export − fed-auc evaluate|:", {k: f"{v:.2e}" for k, v in diffs.items()})
    assert diffs["torchscript"] <= TORCHSCRIPT_TOLERANCE
    assert max(diffs["onnx"], diffs["onnx one image"], diffs["bundle"]) <= ONNX_TOLERANCE
    assert expected.std() > 0  # the images are told apart: a constant score would pass anything
    return diffs


def test_every_format_scores_as_fed_auc_evaluate(simulated, tmp_path):
    model_dir, out = simulated
    card = json.loads((model_dir / "model_card.json").read_text())
    assert card["tta"] == "flip" and card["image_size"] == 28  # mirror and upsampling inside
    _check_all_formats(model_dir, out, _images(28), tmp_path)


def test_the_torchscript_file_refuses_images_of_another_size(simulated):
    _, out = simulated
    with pytest.raises(Exception, match=r"expected float images of shape \(N, 1, 28, 28\)"):
        _torchscript(out / "model.ts", torch.rand(2, 1, 32, 32))


def test_every_export_carries_the_cards_facts(simulated):
    from fed_auc.registry.onnx_format import read_metadata
    from fed_auc.registry.torchscript import read_extra

    model_dir, out = simulated
    card = json.loads((model_dir / "model_card.json").read_text())
    extra = read_extra(out / "model.ts")
    onnx_meta = read_metadata(out / "model.onnx")
    metadata = json.loads((out / "bundle" / "configs" / "metadata.json").read_text())
    found = {
        "top": json.loads((out / "deploy.json").read_text()),
        "torchscript": extra["deploy.json"],
        "onnx": json.loads(onnx_meta["deploy.json"]),
        "bundle": metadata["fed_auc"],
        "bundle file": json.loads((out / "bundle" / "configs" / "deploy.json").read_text()),
    }
    assert extra["model_card.json"] == card == json.loads(onnx_meta["model_card.json"])
    names = card["label_names"]
    thresholds = dict(zip(names, card["threshold"], strict=True))
    for where, facts in found.items():
        assert facts["labels"] == names, where
        assert facts["positive_class"] == card["positive_class"], where
        assert facts["operating_point"]["threshold"] == thresholds, where
        assert "Youden" in facts["operating_point"]["rule"], where
        assert facts["calibration"] == card["calibration"] and card["calibration"][0]["x"]
        assert facts["training"]["run_id"] == card["run_id"], where
        assert facts["training"]["selected"] == card["selected"], where
        assert facts["training"]["algorithm"] == card["algorithm"], where
        assert facts["validation"]["sites"] == [s["site"] for s in card["sites"]], where
        assert facts["validation"]["validation_auc"] == card["global_val_auc"], where
        assert facts["input"]["image_size"] == card["image_size"] == 28, where
        assert facts["input"]["normalization"]["name"] == "unit", where
        assert facts["test_time_augmentation"]["mode"] == card["tta"], where
        assert facts["model"]["sha256"] == sha256(model_dir / "model.pt"), where
        assert facts["privacy"] == {"differential_privacy": "none", "secure_aggregation": False}
    assert float(onnx_meta["max_abs_diff"]) <= float(onnx_meta["tolerance"]) == ONNX_TOLERANCE
    assert found["torchscript"]["check"]["max_abs_diff"] <= TORCHSCRIPT_TOLERANCE
    assert found["top"]["exports"]["onnx"]["sha256"] == sha256(out / "model.onnx")
    inputs = metadata["network_data_format"]["inputs"]["image"]
    assert inputs["spatial_shape"] == [28, 28] and inputs["value_range"] == [0, 1]
    # the calibration travels as knots any numpy applies: monotone probabilities
    probs = apply_calibration(np.linspace(0, 1, 50), found["onnx"]["calibration"][0])
    assert np.all(np.diff(probs) >= 0) and 0 <= probs.min() <= probs.max() <= 1
    people = (out / "MODEL_CARD.md").read_text()  # the card's copy says it for people too
    assert f"Calibration (score → probability): {names[0]}: isotonic, pooled validation" in people
    readme = (out / "bundle" / "docs" / "README.md").read_text()
    assert "numpy.interp" in readme and "monai.bundle run" in readme


@pytest.fixture(params=["batch", "group"])
def older_model(tmp_path, request) -> Path:
    """A hand-written registry model: ImageNet input normalization, 2 labels, 36 px (no
    upsampling), no TTA, and a card from before thresholds, calibration and privacy; with
    BatchNorm, and with GroupNorm as DP-SGD trains it (the bundle's config names the groups)."""
    torch.manual_seed(0)
    model = build_model("tiny", num_labels=2, norm=request.param, input_norm="imagenet")
    for module in model.modules():  # BatchNorm statistics that are not the identity
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.2, 0.2)
            module.running_var.uniform_(0.5, 2.0)
    folder = tmp_path / "older"
    save_torch({"format": MODEL_FORMAT, "model_config": model.config(), "auc": {},
                "state_dict": model.state_dict(), "label_names": ["x", "y"],
                "image_size": 36}, folder / "model.pt")  # fmt: skip
    save_json({"run_id": "older", "label_names": ["x", "y"], "image_size": 36},
              folder / "model_card.json")  # fmt: skip
    return folder


def test_an_older_card_exports_with_normalization_inside_and_says_what_it_lacks(
    older_model, tmp_path
):
    out = tmp_path / "deploy"
    main(["export", str(older_model), "--out", str(out)])
    _check_all_formats(older_model, out, _images(36), tmp_path)
    facts = json.loads((out / "deploy.json").read_text())
    assert facts["input"]["normalization"] == {"name": "imagenet", "mean": 0.449, "std": 0.226,
                                               "formula": "(x - mean) / std",
                                               "where": "inside the model"}  # fmt: skip
    assert facts["calibration"] == "not recorded"
    assert facts["operating_point"]["threshold"] == "not recorded"
    assert facts["positive_class"] == "not recorded"
    assert facts["privacy"] == {"differential_privacy": "not recorded",
                                "secure_aggregation": "not recorded"}  # fmt: skip
    assert facts["validation"]["sites"] == "not recorded"


def test_bad_input_is_refused_in_one_line_naming_what_and_where(simulated, tmp_path):
    model_dir, _ = simulated
    empty = tmp_path / "empty"
    empty.mkdir()
    foreign = tmp_path / "foreign" / "model.pt"
    foreign.parent.mkdir()
    foreign.write_text("not a model")
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    cases = [
        ([str(empty), "--out", str(tmp_path / "a")], f"model {empty}: no model.pt found"),
        ([str(foreign.parent), "--out", str(tmp_path / "b")],
         f"model {foreign}: not a {MODEL_FORMAT} file"),
        ([str(tmp_path / "missing"), "--out", str(tmp_path / "c")],
         f"model {tmp_path / 'missing'}: no such file or folder"),
        ([str(model_dir), "--out", str(tmp_path / "d"), "--format", "onnx,tflite"],
         "--format 'onnx,tflite': unknown format 'tflite'; valid: torchscript, onnx, bundle"),
        ([str(model_dir), "--out", str(full)], f"--out {full}: folder is not empty (notes.txt)"),
    ]  # fmt: skip
    for args, message in cases:
        with pytest.raises(SystemExit) as exc:
            main(["export", *args])
        text = str(exc.value)
        assert text.startswith(f"fed-auc export: {message}") and "\n" not in text, text
    assert not any((tmp_path / name).exists() for name in "abcd")
    # --force writes the export beside what the folder held, replacing only the export's files
    main(["export", str(model_dir), "--out", str(full), "--format", "torchscript", "--force"])
    assert sorted(p.name for p in full.iterdir()) == [
        "MODEL_CARD.md", "deploy.json", "model.ts", "model_card.json", "notes.txt"
    ]  # fmt: skip


def test_an_onnx_file_outside_its_tolerance_is_not_written(simulated, tmp_path, monkeypatch):
    import fed_auc.registry.deployment as deployment

    model_dir, _ = simulated
    monkeypatch.setattr(deployment, "ONNX_TOLERANCE", -1.0)  # any difference is too large
    out = tmp_path / "deploy"
    with pytest.raises(
        SystemExit, match=r"ONNX export: onnxruntime's scores differ .* not written"
    ):
        main(["export", str(model_dir), "--out", str(out)])
    assert not out.exists() or not any(out.iterdir())
    assert not list(tmp_path.glob(".deploy.*"))  # the temporary folder is gone too
