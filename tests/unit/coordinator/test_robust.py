"""Robust aggregation: centered clipping around the replies' median, in model-move units.

Properties rather than recomputed formulas: replies within τ of the others pass unchanged
(so the backend's own mean, and CODASCA's invariant, are exact); a far reply ends exactly τ
from the median, in its own direction; a gradient block is clipped in the units of the move
it makes; an attack under no norm bound stays out of the model.
"""

from __future__ import annotations

import pytest
import torch

from fed_auc.algorithms.base import ReplyBlock
from fed_auc.coordinator.robust import Aggregation
from fed_auc.exchange import Reply
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import load_torch
from fed_auc.simulation import run_simulation

BASE = {"w/x": torch.zeros(2), "w/y": torch.zeros(1)}


def replies(*values: list[float]) -> list[Reply]:
    return [
        Reply(
            {"w/x": torch.tensor(v[:2]), "w/y": torch.tensor(v[2:]), "buf/n": torch.tensor([3])},
            steps=1,
            num_examples=1,
        )
        for v in values
    ]


def iterate_blocks(given: list[Reply]) -> list[list[ReplyBlock]]:
    return [
        [ReplyBlock("", tuple(n for n in r.tensors if n.startswith("w/")), BASE)] for r in given
    ]


def test_replies_within_the_radius_of_the_median_pass_unchanged() -> None:
    given = replies([1.0, 0.0, 0.5], [1.2, 0.1, 0.4], [0.9, -0.1, 0.6], [1.1, 0.0, 0.5])
    out = Aggregation("centered_clip", 1.0).apply(given, iterate_blocks(given))
    for before, after in zip(given, out, strict=True):
        for name, tensor in before.tensors.items():
            assert torch.equal(after.tensors[name], tensor)
    assert Aggregation("mean").apply(given, iterate_blocks(given)) == given


def test_a_far_reply_ends_on_the_sphere_of_radius_tau_around_the_median_in_its_direction():
    given = replies([0.0, 0.0, 0.0], [0.2, 0.0, 0.0], [0.4, 0.0, 0.0], [40.0, 30.0, 0.0])
    out = Aggregation("centered_clip", 2.0).apply(given, iterate_blocks(given))
    centre = torch.tensor([0.3, 0.0, 0.0])  # coordinate-wise median of the four
    far = torch.cat([out[3].tensors["w/x"], out[3].tensors["w/y"]])
    assert float((far - centre).norm()) == pytest.approx(2.0, rel=1e-6)
    direction = torch.tensor([39.7, 30.0, 0.0])
    cosine = torch.nn.functional.cosine_similarity(far - centre, direction, dim=0)
    assert float(cosine) == pytest.approx(1.0, abs=1e-6)
    assert torch.equal(out[0].tensors["w/x"], given[0].tensors["w/x"])  # near ones untouched
    assert torch.equal(out[3].tensors["buf/n"], torch.tensor([3]))  # buffers and counts too


def test_a_gradient_block_is_clipped_as_the_move_it_makes() -> None:
    """rate 0.1: gradients 0, 0, 0 and 100 move the model 0, 0, 0 and 10; τ = 1 leaves the
    last one moving the model by 1, i.e. a gradient of 10."""
    given = [
        Reply({"g/w/x": torch.tensor([v])}, steps=0, num_examples=1) for v in (0.0, 0.0, 0.0, 100.0)
    ]
    blocks = [[ReplyBlock("g/", ("g/w/x",), {}, 0.1, 0.1)] for _ in given]
    out = Aggregation("centered_clip", 1.0).apply(given, blocks)
    assert float(out[3].tensors["g/w/x"]) == pytest.approx(10.0, rel=1e-6)


def test_a_weak_site_holding_fewer_variables_is_measured_on_what_it_holds() -> None:
    """Partial training: the centre of each variable is the median over its holders."""
    given = replies([0.0, 0.0, 0.0], [0.1, 0.0, 0.1], [0.2, 0.0, 0.2])
    weak = Reply({"w/y": torch.tensor([9.0])}, steps=1, num_examples=1)  # trains y only
    blocks = iterate_blocks(given) + [[ReplyBlock("", ("w/y",), BASE)]]
    out = Aggregation("centered_clip", 0.5).apply([*given, weak], blocks)
    # y's median over four holders: (0.1 + 0.2) / 2 = 0.15; the weak reply ends 0.5 above it.
    assert float(out[3].tensors["w/y"]) == pytest.approx(0.65, rel=1e-6)
    assert set(out[3].tensors) == {"w/y"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mode", "must be one of"),
        ("mean:0.2", "takes no radius"),
        ("centered_clip", "finite radius"),
        ("centered_clip:-1", "finite radius"),
        ("centered_clip:nan", "finite radius"),
        ("centered_clip:x", "look like"),
    ],
)
def test_bad_aggregation_is_refused(text, message) -> None:
    with pytest.raises(ValueError, match=message):
        Aggregation.parse(text)
    assert Aggregation.parse("centered_clip:0.5") == Aggregation("centered_clip", 0.5)


@pytest.mark.parametrize("method", ["median", "trimmed_mean", "trimmed_mean:0.2"])
def test_median_and_trimmed_mean_are_refused_by_name_with_the_reason(tmp_path, method) -> None:
    for algorithm in ("codasca", "local_sgda", "fedavg"):
        with pytest.raises(ValueError, match="not offered: .* median of their gradients"):
            ExperimentConfig(runs_dir=str(tmp_path), algorithm=algorithm, aggregation=method)


def test_codasca_refuses_centered_clip_by_name_with_the_reason(tmp_path) -> None:
    with pytest.raises(ValueError, match="with 'codasca': its control variates need c"):
        ExperimentConfig(runs_dir=str(tmp_path), aggregation="centered_clip:1")
    ExperimentConfig(runs_dir=str(tmp_path), algorithm="coda_plus", aggregation="centered_clip:1")


def test_centered_clip_keeps_a_large_but_finite_attack_out_of_the_model(
    tmp_path, monkeypatch
) -> None:
    from fed_auc.data.synthetic import DEFAULT_PROFILES
    from fed_auc.node.node import Node

    original, bad = Node.train, DEFAULT_PROFILES[0].name

    def attack(self, broadcast):
        reply = original(self, broadcast)
        if self.name == bad:  # every weight pushed far away: finite, under no norm bound
            reply.tensors = {
                n: t + 50.0 if n.startswith("w/") else t for n, t in reply.tensors.items()
            }
        return reply

    monkeypatch.setattr(Node, "train", attack)
    models = {}
    for method in ("mean", "centered_clip:1"):
        config = ExperimentConfig(
            runs_dir=str(tmp_path / method.replace(":", "_")),
            algorithm="coda_plus",
            sites=4,
            rounds=2,
            local_steps=2,
            data_scale=0.15,
            batch_size=16,
            aggregation=method,
        )
        models[method] = load_torch(run_simulation(config)["model_path"])["state_dict"]
    weight = next(n for n in models["mean"] if n.endswith("conv0.weight"))
    assert float(models["mean"][weight].abs().mean()) > 10  # the mean took the attack in
    assert float(models["centered_clip:1"][weight].abs().mean()) < 1  # clipping did not
