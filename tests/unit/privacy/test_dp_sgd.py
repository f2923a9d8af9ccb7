"""Example-level DP-SGD: per-example gradients, clipping, noise, accounting, spent budgets."""

from __future__ import annotations

import json
import math
from pathlib import Path

import dp_accounting
import pytest
import torch
from dp_accounting import pld, rdp

from fed_auc.algorithms import build_backend
from fed_auc.coordinator.loop import Coordinator
from fed_auc.exchange import Broadcast
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.losses import build_loss
from fed_auc.models import build_model
from fed_auc.node.node import LocalTraining, Node
from fed_auc.privacy.accounting import (
    LEDGER_FILE,
    BudgetSpent,
    Mechanism,
    Step,
    epsilon,
    noise_for_plan,
)
from fed_auc.privacy.dp_sgd import DrawLog, ExampleDP, PrivateGradients, per_example_gradients
from fed_auc.store.run_store import RunStore
from fed_auc.trainable import Trainable
from fed_auc.transport.local import LocalTransport
from tests.support.dp import tiny_site


@pytest.fixture
def float64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def tiny(loss: str = "auc_margin") -> Trainable:
    torch.manual_seed(0)
    trainable = Trainable(build_model("tiny", norm="group"), build_loss(loss, 1, [0.3]))
    if trainable.is_minimax:  # away from 0 so every term of the loss has a gradient
        with torch.no_grad():
            trainable.loss.a.fill_(0.2)
            trainable.loss.b.fill_(0.6)
            trainable.loss.alpha.fill_(0.4)
    return trainable


def batch(rows: int = 6, side: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.rand(rows, 1, side, side, generator=generator)
    y = (torch.arange(rows) % 3 == 0).to(x.dtype).unsqueeze(1)
    return x, y


@pytest.mark.parametrize("loss", ["auc_margin", "auc_square", "ce"])
def test_per_example_gradients_are_those_of_one_example_batches(float64, loss) -> None:
    trainable = tiny(loss)
    x, y = batch()
    names = [*trainable.primal, *trainable.dual]
    mean, per_example = per_example_gradients(trainable, x, y, names)
    for i in range(len(x)):
        value, primal, dual = trainable.gradients(x[i : i + 1], y[i : i + 1])
        for got, want in zip(per_example, primal + dual, strict=True):
            torch.testing.assert_close(got[i], want, rtol=1e-10, atol=1e-12)
    # one label, all known: the batch loss is the mean of its rows' losses (DP-SGD's premise)
    value, primal, dual = trainable.gradients(x, y)
    torch.testing.assert_close(mean, value, rtol=1e-10, atol=1e-12)
    for got, want in zip(per_example, primal + dual, strict=True):
        torch.testing.assert_close(got.mean(dim=0), want, rtol=1e-9, atol=1e-12)


def test_dual_gradients_at_a_snapshot_per_example(float64) -> None:
    trainable = tiny()
    x, y = batch()
    point = {n: t.detach() + 0.05 for n, t in trainable.primal.items()}
    _, per_example = per_example_gradients(trainable, x, y, list(trainable.dual), point)
    for i in range(len(x)):
        want = trainable.dual_gradients_at(point, x[i : i + 1], y[i : i + 1])
        torch.testing.assert_close(per_example[0][i], want[0], rtol=1e-10, atol=1e-12)


def private(trainable: Trainable, clip: float, sigma: float, seed: int = 0) -> DrawLog:
    log = DrawLog()
    trainable.private = PrivateGradients(clip, sigma, log, torch.Generator().manual_seed(seed))
    return log


def summed_gradient(trainable: Trainable, x, y, clip: float) -> torch.Tensor:
    """Σ_i clip(g_i) over the rows (σ = 0, normalizer 1), as one flat vector."""
    log = private(trainable, clip, 0.0)
    log.draw(0.1, 1.0)
    _, primal, dual = trainable.gradients(x, y)
    trainable.private = None
    return torch.cat([g.flatten() for g in primal + dual])


def test_clipping_bounds_each_examples_contribution(float64) -> None:
    trainable = tiny()
    x, y = batch(rows=5)
    x[2] *= 50.0  # an outlier whose own gradient is far above C
    clip = 0.01
    names = [*trainable.primal, *trainable.dual]
    _, per_example = per_example_gradients(trainable, x, y, names)
    norms = torch.cat([g.reshape(5, -1) for g in per_example], dim=1).norm(dim=1)
    assert float(norms.min()) > clip  # clipping is active for every row
    full = summed_gradient(trainable, x, y, clip)
    for i in range(len(x)):  # the sensitivity to adding or removing any one example is C
        keep = [j for j in range(len(x)) if j != i]
        without = summed_gradient(trainable, x[keep], y[keep], clip)
        assert float((full - without).norm()) == pytest.approx(clip, rel=1e-9)
    loose = summed_gradient(trainable, x, y, clip=1e9)  # no clipping: the plain sum
    torch.testing.assert_close(loose, torch.cat([g.sum(0).flatten() for g in per_example]))


def test_noise_has_std_sigma_c_over_the_batch_size_and_is_seeded(float64) -> None:
    trainable = tiny()
    x, y = batch(rows=0)  # an empty Poisson batch: only the noise is released
    outputs = []
    for seed in (0, 0, 1):
        log = private(trainable, clip=0.5, sigma=3.0, seed=seed)
        log.draw(0.1, 8.0)
        _, primal, dual = trainable.gradients(x, y)
        outputs.append(torch.cat([g.flatten() for g in primal + dual]))
    assert len(outputs[0]) > 10_000
    assert float(outputs[0].std()) == pytest.approx(3.0 * 0.5 / 8.0, rel=0.03)
    assert torch.equal(outputs[0], outputs[1]) and not torch.equal(outputs[0], outputs[2])


def test_a_gradient_on_data_the_sampler_did_not_draw_is_refused(float64) -> None:
    trainable = tiny()
    private(trainable, 1.0, 1.0)
    with pytest.raises(RuntimeError, match="not drawn by the node's sampler"):
        trainable.gradients(*batch())


def test_epsilon_is_the_librarys_for_the_same_sigma_q_and_steps() -> None:
    q, sigma, steps, delta = 0.02, 1.1, 500, 1e-5
    accountant = rdp.RdpAccountant()  # an independent call of the library
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    accountant.compose(event, steps)
    assert epsilon([Step(q, sigma, steps)], delta) == pytest.approx(
        accountant.get_epsilon(delta), rel=1e-12
    )
    # the tighter PLD accountant agrees that RDP bounds ε from above, within a factor
    tight = pld.PLDAccountant()
    tight.compose(event, steps)
    assert 0.6 < tight.get_epsilon(delta) / epsilon([Step(q, sigma, steps)], delta) <= 1.0
    # steps recorded apart compose to the same ε as recorded together
    assert epsilon([Step(q, sigma, 200), Step(q, sigma, 300)], delta) == pytest.approx(
        epsilon([Step(q, sigma, steps)], delta)
    )
    assert epsilon([], delta) == 0.0


def test_a_batch_evaluated_twice_costs_one_step_at_sigma_over_root_two() -> None:
    log = DrawLog()
    log.draw(0.05, 32.0)
    log.evaluated()
    log.evaluated()  # FedSGDA-STORM's anchor: the same rows at a second point
    log.draw(0.05, 32.0)  # drawn but never used: nothing released
    for _ in range(3):  # a full pass in three chunks
        log.chunk(1, 10.0)
        log.evaluated()
    assert log.steps(2.0) == [Step(0.05, 2.0 / math.sqrt(2)), Step(1.0, 2.0)]


def test_the_calibrated_noise_spends_the_target_and_no_more() -> None:
    sigma = noise_for_plan(3.0, 1e-5, (Mechanism(0.05, 1.0, 400),))
    spent = epsilon([Step(0.05, sigma, 400)], 1e-5)
    assert spent <= 3.0 and spent == pytest.approx(3.0, rel=1e-3)
    assert epsilon([Step(0.05, 0.99 * sigma, 400)], 1e-5) > 3.0  # less noise would overspend


def dp_node(tmp_path: Path, target: float, planned: int) -> Node:
    dp = ExampleDP(clip=1.0, delta=1e-5, target_epsilon=target, rounds=planned // 2, local_steps=2)
    model = build_model("tiny", norm="group")
    training = LocalTraining(model.config(), "auc_margin", batch_size=8)
    backend = build_backend("local_sgda", local_steps=2)
    return Node(tiny_site(), backend, training, tmp_path / "node", privacy=dp)


def test_a_site_whose_budget_is_spent_stops_and_says_so(tmp_path: Path) -> None:
    node = dp_node(tmp_path, target=2.0, planned=4)  # the budget covers two rounds of 2 steps
    tensors = node.trainable.tensors()
    spent = []
    for round_ in range(2):
        reply = node.train(Broadcast(round_, "train", tensors, {"pos_ratio": [0.25], "lr": 0.1,
                                                                "local_steps": 2}))  # fmt: skip
        assert "train_loss" not in reply.metrics  # computed from raw data: never sent
        spent.append(reply.metrics["dp_epsilon"])
    assert spent[0] < spent[1] <= 2.0
    request = Broadcast(2, "train", tensors, {"pos_ratio": [0.25], "lr": 0.1, "local_steps": 2})
    with pytest.raises(BudgetSpent, match="budget spent.*not sent.*stops training"):
        node.train(request)
    again = dp_node(tmp_path, target=2.0, planned=4)  # a restarted node remembers
    assert again.privacy.ledger.epsilon() == pytest.approx(spent[1])
    failure = LocalTransport([again]).train({"hospital_a": request})["hospital_a"]
    assert failure.status == "budget_spent" and "privacy budget spent" in failure.message
    assert (tmp_path / "node" / LEDGER_FILE).exists()


def test_a_repeated_release_is_the_same_bytes_and_is_counted_once(tmp_path: Path) -> None:
    config = {"pos_ratio": [0.25], "lr": 0.1, "local_steps": 2, "commit": None, "continue": None}
    node = dp_node(tmp_path, target=8.0, planned=8)
    tensors = node.trainable.tensors()
    first = node.train(Broadcast(0, "train", tensors, config))
    # the coordinator lost that reply (crash, resume): it asks again from the same state
    again = dp_node(tmp_path, target=8.0, planned=8).train(Broadcast(0, "train", tensors, config))
    for name, tensor in first.tensors.items():
        assert torch.equal(again.tensors[name], tensor), name
    assert again.metrics["dp_epsilon"] == first.metrics["dp_epsilon"]  # nothing new released
    # another broadcast for the same round is another release: fresh noise, and it is counted
    moved = {n: t + 0.01 if n.startswith("w/") else t for n, t in tensors.items()}
    other = dp_node(tmp_path, target=8.0, planned=8).train(Broadcast(0, "train", moved, config))
    assert other.metrics["dp_epsilon"] > first.metrics["dp_epsilon"]
    noise = [other.tensors[n] - moved[n] - (first.tensors[n] - tensors[n]) for n in tensors]
    assert max(float(d.abs().max()) for d in noise) > 1e-3


def test_a_run_ends_cleanly_when_every_budget_is_spent(tmp_path: Path) -> None:
    node = dp_node(tmp_path, target=2.0, planned=4)
    server = Trainable(build_model("tiny", norm="group"), build_loss("auc_margin", 1, [0.5]))
    store = RunStore(tmp_path / "runs")
    run_id = store.create_run("local_sgda", {})
    coordinator = Coordinator(
        build_backend("local_sgda", local_steps=2), LocalTransport([node]), store, run_id,
        tmp_path / "runs" / run_id, server,
    )  # fmt: skip
    records = coordinator.run(5)
    coordinator.close()
    assert [r.round for r in records] == [0, 1, 2]  # round 3 would pass ε = 2
    rows = store.site_rounds(run_id)
    assert rows["dp_epsilon"].iloc[1:].is_monotonic_increasing
    assert float(rows["dp_epsilon"].max()) <= 2.0
    events = store.events(run_id)
    assert events["message"].str.contains("budget_spent: privacy budget spent").any()
    assert events["message"].str.contains("every site asked .* has spent").any()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"dp": "sample"}, "dp"),
        ({"dp": "example"}, "dp_clip"),
        ({"dp": "example", "dp_clip": 1.0}, "target_epsilon"),
        ({"dp": "example", "dp_clip": -1.0, "dp_noise": 1.0}, "dp_clip"),
        ({"dp": "example", "dp_clip": 1.0, "dp_noise": 1.0, "dp_delta": 1.5}, "dp_delta"),
        ({"dp": "example", "dp_clip": 1.0, "target_epsilon": 0.0}, "target_epsilon"),
        ({"dp": "example", "dp_clip": 1.0, "dp_noise": 1.0, "warmup_rounds": 2}, "warmup_rounds"),
        ({"dp": "update", "dp_clip": 1.0, "dp_noise": 1.0, "norm": "batch"}, "norm"),
        ({"dp_clip": 1.0, "target_epsilon": 3.0, "warmup_rounds": 1}, "warmup_rounds"),
        ({"target_epsilon": 3.0}, "target_epsilon"),
        ({"dp": "update"}, "dp_clip"),
        ({"dp": "example", "dp_clip": 1.0, "dp_noise": 1.0, "norm": "batch"}, "norm"),
        ({"norm": "layer"}, "norm"),
    ],
)
def test_bad_dp_settings_name_the_field(options, field, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=field):
        ExperimentConfig(runs_dir=str(tmp_path), **options)


def test_dp_example_plans_the_run_and_uses_group_norm(tmp_path: Path) -> None:
    config = ExperimentConfig(
        runs_dir=str(tmp_path), rounds=5, local_steps=3, dp="example", dp_clip=1.0,
        target_epsilon=3.0,
    )  # fmt: skip
    planned = config.example_dp()
    assert (planned.rounds, planned.local_steps) == (5, 3) and config.model_norm() == "group"
    update = ExperimentConfig(runs_dir=str(tmp_path), rounds=5, dp_clip=1.0, dp_noise=0.5)
    assert update.example_dp() is None and update.model_norm() == "group"
    assert update.update_dp().rounds == 5 and update.update_dp().accounted
    clip_only = ExperimentConfig(runs_dir=str(tmp_path), dp_clip=1.0)
    assert not clip_only.update_dp().accounted and clip_only.model_norm() == "batch"


@pytest.mark.slow
def test_a_dp_run_records_each_sites_epsilon_in_the_store_and_the_card(tmp_path: Path) -> None:
    from fed_auc.simulation import run_simulation

    config = ExperimentConfig(
        runs_dir=str(tmp_path), rounds=2, local_steps=2, batch_size=8, image_size=16,
        data_scale=0.2, dp="example", dp_clip=1.0, target_epsilon=3.0,
    )  # fmt: skip
    summary = run_simulation(config)
    run_dir = Path(summary["run_dir"])
    card = json.loads((run_dir / "model" / "model_card.json").read_text())
    assert card["model_config"]["norm"] == "group"
    spent = card["privacy"]["sites"]
    with RunStore(tmp_path) as store:
        rows = store.site_rounds(summary["run_id"])
    assert sorted(spent) == sorted(rows["site"].unique())
    for site, values in spent.items():
        ledger = json.loads((run_dir / "nodes" / site / LEDGER_FILE).read_text())
        steps = [Step(*s) for r in ledger["releases"].values() for s in r["steps"]]
        assert len(steps) == 4  # 2 rounds × 2 local steps, one evaluation each
        accountant = rdp.RdpAccountant()  # the library, called on the ledger directly
        for step in steps:
            accountant.compose(
                dp_accounting.PoissonSampledDpEvent(
                    step.q, dp_accounting.GaussianDpEvent(step.sigma)
                )
            )
        assert values["epsilon_run"] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
        assert 2.9 < values["epsilon_run"] <= 3.0  # the planned steps spend the target
        last = rows[(rows["site"] == site) & (rows["round"] == 2)]
        assert float(last["dp_epsilon"].iloc[0]) == pytest.approx(values["epsilon_run"])
    assert "## Privacy (example-level DP-SGD)" in (run_dir / "model" / "MODEL_CARD.md").read_text()
