"""Client-side DP: every block of an update clipped to C, Gaussian noise σ·C, seeded, recorded;
its site-level accountant checked against dp-accounting called directly."""

from __future__ import annotations

import json
import math
from pathlib import Path

import dp_accounting
import pandas as pd
import pytest
import torch
from dp_accounting import rdp

from fed_auc.algorithms import build_backend
from fed_auc.algorithms.base import ReplyBlock
from fed_auc.exchange import Broadcast, Reply
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.models import build_model
from fed_auc.node.node import LocalTraining, Node
from fed_auc.privacy.accounting import LEDGER_FILE, BudgetSpent
from fed_auc.privacy.update_dp import Privacy, UpdateDP
from fed_auc.registry.card import privacy_card
from fed_auc.run.lifecycle import card_settings
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore
from fed_auc.transport.local import LocalTransport
from tests.support.dp import tiny_site


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
    out = Privacy(clip=1.0).privatize(reply, blocks(broadcast))
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
    kept = Privacy(clip=1.0).privatize(small, blocks(broadcast))
    for name, tensor in small.tensors.items():
        torch.testing.assert_close(kept.tensors[name], tensor)
    assert (kept.site, kept.round, kept.phase, kept.steps) == ("s", 3, "train", 2)


def test_noise_has_the_stated_scale_and_comes_from_the_generator_given() -> None:
    reply, broadcast = make(scale=0.0)  # no update at all: what comes back is the noise
    privacy = Privacy(clip=0.5, noise_multiplier=2.0)

    def noised(seed: int):
        return privacy.privatize(reply, blocks(broadcast), torch.Generator().manual_seed(seed))

    out = noised(1)
    noise = torch.cat([(out.tensors[n] - broadcast.tensors[n]).flatten() for n in ("w/x", "w/y")])
    assert float(noise.std()) == pytest.approx(1.0, rel=0.15)  # σ·C = 1
    assert torch.equal(noised(1).tensors["w/x"], out.tensors["w/x"])
    assert not torch.equal(noised(2).tensors["w/x"], out.tensors["w/x"])
    with pytest.raises(ValueError, match="noise generator"):
        privacy.privatize(reply, blocks(broadcast))


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
        reply, blocks(broadcast), torch.Generator().manual_seed(0)
    )
    assert out.trained_groups == ["norm", "classifier"]
    assert (out.site, out.round, out.phase, out.num_examples) == ("s", 3, "train", 10)


# -- update-level DP's site-level accountant -------------------------------------------------
DELTA = 1e-5


def site_level_epsilon(sigma: float, releases: int) -> float:
    """dp-accounting called directly: ``releases`` Gaussian mechanisms, no subsampling, for
    replace-one: two hospitals' clipped moves differ by up to 2C while the noise is σC, so each
    is a Gaussian of noise multiplier σ/2 (the reference the node's ledger must match)."""
    accountant = rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(sigma / 2), releases)
    return accountant.get_epsilon(DELTA)


def test_each_site_spends_the_site_level_epsilon_of_the_rounds_it_took_part_in(tmp_path) -> None:
    config = ExperimentConfig(
        runs_dir=str(tmp_path), sites=3, rounds=3, participation=0.5, local_steps=2,
        batch_size=8, image_size=16, data_scale=0.15, select="last", dp_clip=0.5, dp_noise=2.0,
        dp_delta=DELTA,
    )  # fmt: skip
    summary = run_simulation(config)
    run_dir = tmp_path / summary["run_id"]
    with RunStore(tmp_path) as store:
        rows = store.site_rounds(summary["run_id"]).sort_values(["round", "site"])
    sites = sorted(rows["site"].unique())
    taken = dict.fromkeys(sites, 0)
    for round_ in (1, 2, 3):
        these = rows[rows["round"] == round_].set_index("site")
        asked = set(these.index[these["status"] == "completed"])
        assert len(asked) == 2  # ⌈0.5 · 3⌉ sites a round: the others spend nothing
        for site in sites:
            taken[site] += site in asked
            if taken[site]:  # ε of every round it took part in, and of no other
                want = site_level_epsilon(2.0, taken[site])
                assert these.loc[site, "dp_epsilon"] == pytest.approx(want, rel=1e-9)
                assert these.loc[site, "dp_delta"] == DELTA
            else:
                assert math.isnan(these.loc[site, "dp_epsilon"])
    assert rows["train_loss"].isna().all()  # computed from raw data: never sent
    card = json.loads((run_dir / "model" / "model_card.json").read_text())
    assert card["model_config"]["norm"] == "group"  # no BatchNorm statistics leave un-noised
    privacy = card["privacy"]
    assert privacy["mode"] == "update" and privacy["delta"] == DELTA
    assert "q = 1" in privacy["accountant"] and "whole dataset" in privacy["protects"]
    assert privacy["relation"] == "replace one hospital's whole training data"
    assert set(rows.dropna(subset=["dp_epsilon"])["dp_relation"]) == {privacy["relation"]}
    exported = card["selected_round"]
    for site in sites:
        mine = rows[rows["site"] == site].dropna(subset=["dp_epsilon"])
        ledger = json.loads((run_dir / "nodes" / site / LEDGER_FILE).read_text())
        assert [r["steps"] for r in ledger["releases"].values()] == [[[1.0, 1.0, 1]]] * taken[site]
        assert privacy["sites"][site]["epsilon_run"] == pytest.approx(mine["dp_epsilon"].max())
        upto = mine[mine["round"] <= exported]["dp_epsilon"]
        assert privacy["sites"][site]["epsilon_exported"] == pytest.approx(upto.max())
    text = (run_dir / "model" / "MODEL_CARD.md").read_text()
    assert "## Privacy (update-level DP, site-level ε)" in text
    assert f"| {sites[0]} | {privacy['sites'][sites[0]]['epsilon_exported']:.3f} |" in text


def update_node(tmp_path: Path, dp: UpdateDP) -> Node:
    model = build_model("tiny", norm="group")
    training = LocalTraining(model.config(), "auc_margin", batch_size=8)
    backend = build_backend("local_sgda", local_steps=2)
    return Node(tiny_site(), backend, training, tmp_path / "node", privacy=dp)


def request(round_: int, tensors: dict) -> Broadcast:
    config = {"pos_ratio": [0.25], "lr": 0.1, "local_steps": 2, "commit": None, "continue": None}
    return Broadcast(round_, "train", tensors, config)


def test_a_target_epsilon_calibrates_sigma_and_the_ledger_stops_the_site(tmp_path) -> None:
    dp = UpdateDP(clip=1.0, delta=DELTA, target_epsilon=4.0, rounds=2)
    node = update_node(tmp_path, dp)
    sigma = node.privacy.sigma  # the planner's: two releases spend the target
    assert site_level_epsilon(sigma, 2) == pytest.approx(4.0, rel=1e-3)
    assert site_level_epsilon(sigma, 2) <= 4.0 < site_level_epsilon(0.99 * sigma, 2)
    tensors = node.trainable.tensors()
    for round_ in range(2):
        reply = node.train(request(round_, tensors))
        assert reply.metrics["dp_epsilon"] == pytest.approx(site_level_epsilon(sigma, round_ + 1))
        assert reply.metrics["dp_noise_multiplier"] == sigma
    with pytest.raises(BudgetSpent, match="budget spent.*not sent.*stops training"):
        node.train(request(2, tensors))
    again = update_node(tmp_path, dp)  # a restarted node remembers: its ledger is on disk
    assert again.privacy.ledger.epsilon() == pytest.approx(site_level_epsilon(sigma, 2))
    failure = LocalTransport([again]).train({"hospital_a": request(3, tensors)})["hospital_a"]
    assert failure.status == "budget_spent" and "spent at round 2" in failure.message


def test_a_repeated_update_is_the_same_bytes_and_counted_once(tmp_path) -> None:
    dp = UpdateDP(clip=0.01, noise_multiplier=1.0, delta=DELTA)
    tensors = update_node(tmp_path, dp).trainable.tensors()
    first = update_node(tmp_path, dp).train(request(0, tensors))
    again = update_node(tmp_path, dp).train(request(0, tensors))  # lost reply, asked again
    for name, tensor in first.tensors.items():
        assert torch.equal(again.tensors[name], tensor), name
    assert again.metrics["dp_epsilon"] == first.metrics["dp_epsilon"] == site_level_epsilon(1, 1)
    # another broadcast for the same round is another update: fresh noise, counted
    moved = {n: t + 0.01 if n.startswith("w/") else t for n, t in tensors.items()}
    other = update_node(tmp_path, dp).train(request(0, moved))
    assert other.metrics["dp_epsilon"] == pytest.approx(site_level_epsilon(1.0, 2))
    noise = [other.tensors[n] - moved[n] - (first.tensors[n] - tensors[n]) for n in tensors]
    assert max(float(d.abs().max()) for d in noise) > 1e-3


def test_clipping_without_noise_keeps_no_ledger_and_claims_no_epsilon(tmp_path) -> None:
    node = update_node(tmp_path, UpdateDP(clip=1.0))
    reply = node.train(request(0, node.trainable.tensors()))
    assert "dp_epsilon" not in reply.metrics and not (tmp_path / "node" / LEDGER_FILE).exists()
    config = ExperimentConfig(runs_dir=str(tmp_path), dp_clip=1.0)
    settings = card_settings(config).privacy
    assert privacy_card(settings, pd.DataFrame(columns=["dp_epsilon"]), 1)["epsilon"] is None
