"""Client-side DP: every block of an update clipped to C, Gaussian noise σ·C, seeded, recorded."""

from __future__ import annotations

import math

import pytest
import torch

from fed_auc.algorithms.base import Broadcast, Reply, ReplyBlock
from fed_auc.experiment import ExperimentConfig
from fed_auc.privacy import Privacy
from fed_auc.simulation import run_simulation
from fed_auc.store import RunStore


def block_norm(tensors: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors.values()))


def make(scale: float) -> tuple[Reply, Broadcast]:
    torch.manual_seed(0)
    model = {"w/x": torch.randn(200), "w/y": torch.randn(3, 50), "auc/a": torch.zeros(1)}
    reply = {n: t + scale * torch.randn_like(t) for n, t in model.items()}
    reply["dc/w/x"] = scale * torch.randn(200)
    reply["buf/mean"] = torch.full((4,), 7.0)
    broadcast = Broadcast(
        round=3, phase="train", tensors={**model, "buf/mean": torch.ones(4)}, config={}
    )
    return Reply(reply, steps=2, num_examples=10, site="s", round=3, phase="train"), broadcast


def blocks(broadcast: Broadcast) -> list[ReplyBlock]:
    """The iterate block and a gradient block applied at rate 0.5 (its move is 0.5 · g)."""
    iterate = ("w/x", "w/y", "auc/a")
    return [
        ReplyBlock("", iterate, {n: broadcast.tensors[n] for n in iterate}),
        ReplyBlock("dc/", ("dc/w/x",), {}, 0.5, 0.5),
    ]


def test_clipping_bounds_each_block_and_leaves_small_updates_and_buffers_alone() -> None:
    reply, broadcast = make(scale=5.0)
    out = Privacy(clip=1.0).privatize(reply, broadcast, "s", blocks(broadcast))
    update = {n: out.tensors[n] - broadcast.tensors[n] for n in ("w/x", "w/y", "auc/a")}
    assert block_norm(update) == pytest.approx(1.0, rel=1e-5)
    # The gradient block's move 0.5 · g is clipped to 1: g to 2, in its own direction.
    assert block_norm({"dc": out.tensors["dc/w/x"]}) == pytest.approx(2.0, rel=1e-5)
    cosine = torch.nn.functional.cosine_similarity(
        out.tensors["dc/w/x"], reply.tensors["dc/w/x"], dim=0
    )
    assert float(cosine) == pytest.approx(1.0, abs=1e-6)
    assert torch.equal(out.tensors["buf/mean"], reply.tensors["buf/mean"])
    small, broadcast = make(scale=1e-3)
    kept = Privacy(clip=1.0).privatize(small, broadcast, "s", blocks(broadcast))
    for name, tensor in small.tensors.items():
        torch.testing.assert_close(kept.tensors[name], tensor)
    assert (kept.site, kept.round, kept.phase, kept.steps) == ("s", 3, "train", 2)


def test_noise_has_the_stated_scale_and_is_seeded_per_site_and_round() -> None:
    reply, broadcast = make(scale=0.0)  # no update at all: what comes back is the noise
    privacy = Privacy(clip=0.5, noise_multiplier=2.0, seed=1)
    out = privacy.privatize(reply, broadcast, "s", blocks(broadcast))
    noise = torch.cat([(out.tensors[n] - broadcast.tensors[n]).flatten() for n in ("w/x", "w/y")])
    assert float(noise.std()) == pytest.approx(1.0, rel=0.15)  # σ·C = 1
    again = privacy.privatize(reply, broadcast, "s", blocks(broadcast))
    assert torch.equal(again.tensors["w/x"], out.tensors["w/x"])
    other = privacy.privatize(reply, broadcast, "t", blocks(broadcast))
    assert not torch.equal(other.tensors["w/x"], out.tensors["w/x"])


@pytest.mark.parametrize(("clip", "noise"), [(0.0, 1.0), (float("nan"), 0.0), (1.0, -1.0)])
def test_bad_privacy_settings_are_refused(clip, noise) -> None:
    with pytest.raises(ValueError, match="dp"):
        Privacy(clip, noise)
    with pytest.raises(ValueError, match="dp_noise needs dp_clip"):
        ExperimentConfig(dp_noise=1.0)


def test_a_private_run_records_clip_and_noise(tmp_path) -> None:
    config = ExperimentConfig(
        runs_dir=str(tmp_path),
        sites=2,
        rounds=1,
        local_steps=2,
        data_scale=0.15,
        dp_clip=0.5,
        dp_noise=0.1,
    )
    summary = run_simulation(config)
    with RunStore(tmp_path) as store:
        recorded = store.run(summary["run_id"])["config"]
        norms = store.site_rounds(summary["run_id"]).query("round == 1")["update_norm"]
    assert (recorded["dp_clip"], recorded["dp_noise"]) == (0.5, 0.1)
    assert (norms > 0).all()


def test_privatizing_keeps_every_field_of_the_reply() -> None:
    """A weak site's reply says which layer groups it trained; DP must not drop that."""
    reply, broadcast = make(scale=1.0)
    reply.trained_groups = ["norm", "classifier"]
    out = Privacy(clip=1.0, noise_multiplier=0.1).privatize(
        reply, broadcast, "s", blocks(broadcast)
    )
    assert out.trained_groups == ["norm", "classifier"]
    assert (out.site, out.round, out.phase, out.num_examples) == ("s", 3, "train", 10)
