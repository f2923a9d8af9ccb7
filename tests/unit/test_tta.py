"""Test-time augmentation: flip TTA averages image and mirror, wherever a model is scored."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from fed_auc.algorithms import build_backend
from fed_auc.data.base import SiteData, Split
from fed_auc.data.medmnist import load_medmnist
from fed_auc.evaluate.local import evaluate_model
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.models import build_model
from fed_auc.node.node import LocalTraining, Node
from fed_auc.registry.load import load_registered_model
from fed_auc.simulation import run_simulation
from fed_auc.tta import predict, scoring_batch
from tests.support.batches import make_split, ramp_images
from tests.support.data_files import write_npz


def test_flip_is_the_mean_of_image_and_mirror_and_none_is_the_image() -> None:
    torch.manual_seed(0)
    model = build_model("tiny").eval()
    images = ramp_images(5, 16) / 5
    with torch.no_grad():
        plain = torch.sigmoid(model(images)).numpy()
        mirror = torch.sigmoid(model(images.flip(-1))).numpy()
    assert np.abs(plain - mirror).max() > 1e-4  # the network is not mirror-invariant
    assert predict(model, images, "none") == pytest.approx(plain, abs=1e-6)
    assert predict(model, images, "flip", batch=2) == pytest.approx((plain + mirror) / 2, abs=1e-6)
    # a mirror-symmetric image scores the same either way
    symmetric = images + images.flip(-1)
    assert predict(model, symmetric, "flip") == pytest.approx(predict(model, symmetric), abs=1e-6)
    assert predict(model, images[:0], "flip").shape == (0, 1)


def test_large_images_are_scored_in_smaller_chunks_with_the_same_scores() -> None:
    """A scoring chunk is bounded in pixels (DenseNet121 at 224 px took ~8 MB of activations
    per image, so 256 at a time peaked near 2.7 GB): small images still go 256 at a time."""
    sizes = {side: scoring_batch(torch.zeros(1, 1, side, side)) for side in (28, 64, 224, 512)}
    assert sizes == {28: 256, 64: 256, 224: 32, 512: 6}
    torch.manual_seed(0)
    model = build_model("tiny").eval()
    seen: list[int] = []
    model.register_forward_pre_hook(lambda module, args: seen.append(len(args[0])))
    images = torch.rand(70, 1, 224, 224)
    chunked = predict(model, images, "flip")
    assert max(seen) == 32 and sum(seen) == 2 * 70  # both views of every image, 32 at a time
    seen.clear()
    whole = predict(model, images, "flip", batch=70)
    assert seen == [70, 70]
    assert chunked == pytest.approx(whole, abs=1e-6)


def test_unknown_mode_is_named_everywhere() -> None:
    model = build_model("tiny")
    with pytest.raises(ValueError, match="tta must be one of .* got 'rotate'"):
        predict(model, ramp_images(2, 16), "rotate")
    with pytest.raises(ValueError, match="tta must be one of"):
        ExperimentConfig(data="medmnist:x.npz", tta="rotate")
    with pytest.raises(ValueError, match="tta must be one of"):
        evaluate_model(model, {"label_names": ["x"], "tta": "rotate"}, {})


def test_default_follows_the_training_flips() -> None:
    assert ExperimentConfig().test_time_augmentation() == "none"  # synthetic: no flips
    assert ExperimentConfig(data="medmnist:x.npz").test_time_augmentation() == "flip"
    files = ExperimentConfig(data="medmnist:x.npz", augment="none")
    assert files.test_time_augmentation() == "none"
    assert ExperimentConfig(tta="flip").test_time_augmentation() == "flip"


def test_node_scores_validation_and_test_with_its_tta(tmp_path) -> None:
    split = Split(ramp_images(24) / 24, make_split(24, 8).labels)
    site = SiteData("s", split, split, split, ["label"])
    config = {"arch": "tiny", "num_labels": 1, "in_channels": 1}
    backend = build_backend("fedavg", local_steps=1)
    node = Node(site, backend, LocalTraining(config, "ce", batch_size=8, tta="flip"), tmp_path)
    tensors = node.trainable.tensors()
    answer = node.evaluate(tensors, splits=("val", "test"), pooled=True)
    expected = predict(node.trainable.model, split.images, "flip")
    for name in ("val", "test"):
        assert answer.splits[name].scores == pytest.approx(expected, abs=1e-6)
    labels = split.labels.numpy().ravel()
    assert answer.splits["val"].aucs[0].auc == pytest.approx(roc_auc_score(labels, expected))
    with pytest.raises(ValueError, match="tta must be one of"):
        Node(site, backend, LocalTraining(config, "ce", tta="mirror"), tmp_path / "x")
    # a node told only its augmentation (a Flower node) scores as `fed-auc simulate` does
    flip = LocalTraining(config, "ce", augment="flip")
    assert Node(site, backend, flip, tmp_path / "f").tta == "flip"
    assert Node(site, backend, LocalTraining(config, "ce"), tmp_path / "n").tta == "none"


@pytest.fixture(scope="module")
def flip_run(tmp_path_factory):
    """A 2-round run on a small MedMNIST-layout file: defaults, so flip training and TTA."""
    tmp = tmp_path_factory.mktemp("tta")
    npz = write_npz(tmp / "m.npz", n=(60, 40, 40))
    config = ExperimentConfig(
        data=f"medmnist:{npz}", sites=2, rounds=2, local_steps=2, batch_size=8, image_size=16,
        runs_dir=str(tmp / "runs"),
    )  # fmt: skip
    return npz, run_simulation(config)


def test_card_records_tta_and_evaluate_reproduces_the_card(flip_run, tmp_path) -> None:
    npz, summary = flip_run
    model, card = load_registered_model(summary["model_path"])
    assert card["tta"] == "flip"
    card_text = (Path(summary["model_path"]).parent / "MODEL_CARD.md").read_text()
    assert "test-time augmentation `flip`" in card_text
    command = [sys.executable, "-m", "fed_auc.cli", "evaluate", "--model", summary["model_path"]]
    command += ["--data", f"medmnist:{npz}", "--bootstrap", "0"]
    command += ["--manifest", str(Path(summary["run_dir"]) / "partition.json")]
    subprocess.run([*command, "--out", str(tmp_path)], check=True, capture_output=True)
    results = json.loads((tmp_path / "evaluation.json").read_text())
    assert results["tta"] == "flip"
    # pooled test AUC of `evaluate` (the card's TTA) = the run's record of the exported round
    assert results["sites"]["all"]["label"]["auc"] == pytest.approx(card["global_auc"])


def test_evaluate_scores_with_the_cards_tta_unless_told_otherwise(flip_run) -> None:
    npz, summary = flip_run
    model, card = load_registered_model(summary["model_path"])
    pool = load_medmnist(npz)
    test = pool.split == "test"
    images, labels = pool.images[test], pool.labels[test]
    sites = {"all": Split(images, labels)}
    y = labels.numpy().ravel()
    for tta, expected in [(None, "flip"), ("none", "none"), ("flip", "flip")]:
        result = evaluate_model(model, card, sites, n_boot=0, tta=tta)
        assert result["tta"] == expected
        auc = roc_auc_score(y, predict(model, images, expected).ravel())
        assert result["sites"]["all"]["label"]["auc"] == pytest.approx(auc)
    assert evaluate_model(model, {"label_names": ["label"]}, sites, n_boot=0)["tta"] == "none"
