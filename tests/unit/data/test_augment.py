"""Training-time augmentation: seeded, shape- and label-preserving, training batches only."""

from __future__ import annotations

import pytest
import torch

from fed_auc.algorithms import build_backend
from fed_auc.data.augment import Augment
from fed_auc.data.base import SiteData, Split
from fed_auc.data.sampling import BatchStream
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.node.node import LocalTraining, Node
from tests.support.batches import make_split, ramp_images


def test_unknown_mode_is_named() -> None:
    with pytest.raises(ValueError, match="augment must be one of .* got 'rotate'"):
        Augment("rotate")
    with pytest.raises(ValueError, match="augment must be one of"):
        ExperimentConfig(augment="rotate")


@pytest.mark.parametrize("mode", ["flip", "crop_flip"])
def test_same_seed_same_batches_other_seed_other_batches(mode: str) -> None:
    images = ramp_images()
    first, twin, other = Augment(mode, seed=5), Augment(mode, seed=5), Augment(mode, seed=6)
    a, b, c = first(images), twin(images), other(images)
    assert a.shape == images.shape and a.dtype == images.dtype
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert not torch.equal(first(images), a)  # the generator moves on


def test_none_returns_the_batch_unchanged() -> None:
    images = ramp_images(8)
    assert torch.equal(Augment("none", seed=1)(images), images)


def test_flip_mirrors_about_half_of_the_images() -> None:
    images = ramp_images(400)
    out = Augment("flip", seed=0)(images)
    mirrored = torch.tensor([torch.equal(o, i.flip(-1)) for o, i in zip(out, images, strict=True)])
    kept = torch.tensor([torch.equal(o, i) for o, i in zip(out, images, strict=True)])
    assert bool((mirrored ^ kept).all())  # every image is exactly one of the two
    assert 160 < int(mirrored.sum()) < 240  # Binomial(400, 1/2): mean 200, sd 10


def test_crop_is_a_shift_of_at_most_an_eighth_of_the_side() -> None:
    size, pad = 16, 2
    images = ramp_images(200, size)
    out = Augment("crop_flip", seed=3)(images)
    seen = set()
    for o, i in zip(out, images, strict=True):
        padded = torch.nn.functional.pad(i, (pad, pad, pad, pad))
        matches = [
            (dy, dx)
            for dy in range(2 * pad + 1)
            for dx in range(2 * pad + 1)
            for candidate in (o, o.flip(-1))
            if torch.equal(candidate, padded[:, dy : dy + size, dx : dx + size])
        ]
        assert matches, "an augmented image is not a shifted (and maybe mirrored) original"
        seen.add(matches[0])
    assert len(seen) > 15  # of the 25 possible offsets, most are drawn


def test_stream_augments_images_keeps_labels_and_rows() -> None:
    split = Split(ramp_images(40), make_split(40, 8).labels)
    plain = BatchStream(split, batch_size=16, seed=2)
    augmented = BatchStream(split, batch_size=16, seed=2, augment=Augment("crop_flip", seed=9))
    for _ in range(5):
        (x0, y0, _), (x1, y1, _) = next(plain), next(augmented)
        assert torch.equal(y0, y1)  # labels unchanged, same rows drawn
        assert x1.shape == x0.shape and not torch.equal(x0, x1)
        # the integer part of every pixel is its row: the shift pads with 0, never another row
        rows = x0.amax(dim=(1, 2, 3)).floor()
        assert bool((x1.amax(dim=(1, 2, 3)).floor() == rows).all())
    full = torch.cat([x for x, _ in augmented.full_pass(batch_size=16)])
    assert torch.equal(full, split.images)  # full passes (gradient estimates) never augmented


def test_stream_resumes_the_augmentation_exactly() -> None:
    split = Split(ramp_images(40), make_split(40, 8).labels)
    stream = BatchStream(split, batch_size=8, seed=1, augment=Augment("crop_flip", seed=4))
    next(stream)
    saved = stream.state_dict()
    expected = [next(stream)[0] for _ in range(3)]
    again = BatchStream(split, batch_size=8, seed=1, augment=Augment("crop_flip", seed=4))
    again.load_state_dict(saved)
    assert all(torch.equal(e, next(again)[0]) for e in expected)


def test_default_is_flip_for_files_and_none_for_synthetic() -> None:
    assert ExperimentConfig().augmentation() == "none"
    assert ExperimentConfig(data="medmnist:x.npz").augmentation() == "flip"
    assert ExperimentConfig(data="csv:x.csv", augment="crop_flip").augmentation() == "crop_flip"


def test_node_trains_on_augmented_batches_but_evaluates_the_stored_images(tmp_path) -> None:
    split = Split(ramp_images(24), make_split(24, 6).labels)
    site = SiteData("s", split, split, split, ["label"])
    config = {"arch": "tiny", "num_labels": 1, "in_channels": 1}
    backend = build_backend("fedavg", local_steps=1)
    training = LocalTraining(config, "ce", batch_size=8, augment="crop_flip", tta="none")
    node = Node(site, backend, training, tmp_path)
    plain = Node(site, backend, LocalTraining(config, "ce", batch_size=8), tmp_path / "p")
    x, y, _ = next(node.batches)
    x0, y0, _ = next(plain.batches)
    assert torch.equal(y, y0) and not torch.equal(x, x0)
    tensors = node.trainable.tensors()
    scored = node.evaluate(tensors, splits=("test",), pooled=True).splits["test"].scores
    plain.trainable.load(tensors)  # same weights, the stored images, in eval mode
    assert scored == pytest.approx(plain.scores(split.images), abs=1e-6)
