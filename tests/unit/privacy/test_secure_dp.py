"""Differential privacy under secure aggregation: the same ε ledgers, rows and card as without
it, the same model within the encoding's bound while the noise draws are the same, and a run
whose sites run out of budget ends cleanly."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from fed_auc.algorithms import build_backend
from fed_auc.coordinator.checkpoint import load_checkpoint
from fed_auc.coordinator.loop import Coordinator
from fed_auc.coordinator.policy import RoundPolicy
from fed_auc.coordinator.secure_phase import SecureAggregation
from fed_auc.data.base import SiteData, Split
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.losses import build_loss
from fed_auc.models import build_model
from fed_auc.node.node import LocalTraining, Node
from fed_auc.privacy.accounting import LEDGER_FILE
from fed_auc.privacy.dp_sgd import ExampleDP
from fed_auc.privacy.secure.encoding import PLAIN
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore
from fed_auc.trainable import Trainable
from fed_auc.transport.local import LocalTransport

SITES = 3
SMALL = {
    "sites": SITES, "rounds": 2, "local_steps": 2, "batch_size": 8, "data_scale": 0.15,
    "image_size": 16, "select": "last",
}  # fmt: skip
FLOAT32_ROUNDING = 4 * torch.finfo(torch.float32).eps  # a float32 mean's rounding, relative


def simulate(tmp_path: Path, name: str, **options) -> dict:
    runs = tmp_path / name
    summary = run_simulation(ExperimentConfig(runs_dir=str(runs), **SMALL, **options))
    run_dir = runs / summary["run_id"]
    with RunStore(runs) as store:
        rows = store.site_rounds(summary["run_id"])
        rounds = store.rounds(summary["run_id"])
    ledgers = {}
    for ledger in sorted((run_dir / "nodes").glob(f"*/{LEDGER_FILE}")):
        releases = json.loads(ledger.read_text())["releases"].values()
        ledgers[ledger.parent.name] = [(r["round"], r["phase"], r["steps"]) for r in releases]
    return {
        "models": [load_checkpoint(run_dir, r)["state"]["model"] for r in (1, 2)],
        "rows": rows.sort_values(["round", "site"]).reset_index(drop=True),
        "rounds": rounds,
        "card": json.loads((run_dir / "model" / "model_card.json").read_text())["privacy"],
        "ledgers": ledgers,
    }


def assert_within_quantization(secure: dict, plain: dict) -> None:
    """Each secure mean is within K · 2^-33 · (1 + max|x|) / P of the exact mean
    (``encoding``'s bound, P ≥ 1: the weights are over the largest); both float32 means are
    within a few float32 roundings of the tensor's scale of it (a float32 sum of the sites'
    terms rounds at their magnitude, not at the mean's)."""
    assert secure.keys() == plain.keys()
    for name, want in plain.items():
        largest = float(want.abs().max())
        bound = SITES * 2.0 ** -(PLAIN.fraction + 1) * (1 + largest)
        allowed = bound + FLOAT32_ROUNDING * largest
        gap = float((secure[name].double() - want.double()).abs().max())
        assert gap <= allowed, (name, gap, allowed)


def test_dp_sgd_under_secure_aggregation_spends_the_same_epsilon_with_the_same_noise(
    tmp_path, shared_dp_secret
):
    dp = {"dp": "example", "dp_clip": 1.0, "dp_noise": 1.0}
    plain = simulate(tmp_path, "plain", **dp)
    secure = simulate(tmp_path, "secure", secure_aggregation=True, **dp)
    # round 1: both runs broadcast the same model, so every site draws the same Poisson
    # batches and the same noise (seeded by the release's key): the sums agree within the
    # encoding's bound, far below the noise (σC/m ≈ 0.1 per coordinate per step)
    assert_within_quantization(secure["models"][0], plain["models"][0])
    # ε depends on each site's sampling rate, σ and steps only: the same ledgers, rows, card
    assert secure["ledgers"] == plain["ledgers"]
    assert sorted(plain["ledgers"]) == sorted(plain["rows"]["site"].unique())
    for releases in plain["ledgers"].values():  # one release per round, a step per local step
        assert [(r, len(steps)) for r, _, steps in releases] == [(0, 2), (1, 2)]
    trained = plain["rows"]["round"] > 0
    assert plain["rows"].loc[trained, "dp_epsilon"].gt(0).all()
    columns = ["site", "round", "status", "dp_epsilon", "dp_delta"]
    pd.testing.assert_frame_equal(secure["rows"][columns], plain["rows"][columns])
    assert secure["card"] == plain["card"] and secure["card"]["mode"] == "example"
    # round 2's broadcast differs in its last bits (the secure mean is rounded apart from the
    # float32 one), and the noise is keyed by the broadcast's bytes: fresh draws, so only
    # what does not depend on them is compared; the model stays finite and scored
    assert all(torch.isfinite(t).all() for t in secure["models"][1].values())
    assert secure["rounds"]["global_auc"].notna().all()


def test_update_level_dp_under_secure_aggregation_spends_the_same_site_level_epsilon(
    tmp_path, shared_dp_secret
):
    dp = {"dp": "update", "dp_clip": 1.0, "dp_noise": 0.1}
    plain = simulate(tmp_path, "plain", **dp)
    secure = simulate(tmp_path, "secure", secure_aggregation=True, **dp)
    # round 1: the same broadcast, so the same release keys and noise draws
    assert_within_quantization(secure["models"][0], plain["models"][0])
    # ε depends on σ and the rounds a site took part in only: the same ledgers, rows, card
    assert secure["ledgers"] == plain["ledgers"]
    assert sorted(plain["ledgers"]) == sorted(plain["rows"]["site"].unique())
    for releases in plain["ledgers"].values():  # one Gaussian mechanism per round, q = 1
        assert releases == [(0, "train", [[1.0, 0.05, 1]]), (1, "train", [[1.0, 0.05, 1]])]
    columns = ["site", "round", "status", "dp_epsilon", "dp_delta"]
    pd.testing.assert_frame_equal(secure["rows"][columns], plain["rows"][columns])
    assert secure["card"] == plain["card"] and secure["card"]["mode"] == "update"
    assert all(torch.isfinite(t).all() for t in secure["models"][1].values())


def site_data(name: str, rows: int = 40) -> SiteData:
    generator = torch.Generator().manual_seed(2)
    images = torch.rand(rows, 1, 16, 16, generator=generator)
    labels = (torch.arange(rows) % 4 == 0).float().unsqueeze(1)
    images[labels[:, 0] == 1] += 0.3
    split = Split(images, labels)
    return SiteData(name, split, split, split, ["finding"])


def dp_node(tmp_path: Path, name: str, planned: int) -> Node:
    """ε = 2 spent over ``planned`` steps, 2 per round."""
    dp = ExampleDP(clip=1.0, delta=1e-5, target_epsilon=2.0, rounds=planned // 2, local_steps=2)
    training = LocalTraining(build_model("tiny", norm="group").config(), "auc_margin", batch_size=8)
    backend = build_backend("local_sgda", local_steps=2)
    return Node(site_data(name), backend, training, tmp_path / name, privacy=dp)


def test_too_few_sites_with_budget_left_for_a_secure_sum_end_training(tmp_path):
    """a's budget covers two rounds, b's twenty: in round 3 only b could send, fewer than the
    threshold 2, and a's budget never comes back."""
    nodes = [dp_node(tmp_path, "a", planned=4), dp_node(tmp_path, "b", planned=40)]
    server = Trainable(build_model("tiny", norm="group"), build_loss("auc_margin", 1, [0.5]))
    store = RunStore(tmp_path / "runs")
    run_id = store.create_run("local_sgda", {})
    coordinator = Coordinator(
        build_backend("local_sgda", local_steps=2), LocalTransport(nodes), store, run_id,
        tmp_path / "runs" / run_id, server, RoundPolicy(secure=SecureAggregation()),
    )  # fmt: skip
    records = coordinator.run(5)
    coordinator.close()
    assert [r.round for r in records] == [0, 1, 2]
    rows = store.site_rounds(run_id)
    assert rows.loc[rows["round"] > 0, "dp_epsilon"].notna().all()  # recorded through the sum
    a = rows[rows["site"] == "a"].set_index("round")
    assert float(a.loc[2, "dp_epsilon"]) <= 2.0
    events = store.events(run_id)["message"]
    assert events.str.contains("a: |budget_spent: privacy budget spent", regex=True).any()
    assert events.str.contains(
        r"\['a'\] of the sites asked have spent their privacy budget; the 1 left are fewer "
        "than secure aggregation's threshold 2; training ends"
    ).any()
    with pytest.raises(KeyError):  # nothing of the failed round 3 was recorded
        a.loc[3]
