"""The DP planner counts what each backend really releases, and the ledger charges every
release: the plan of every backend equals its ledger after a real run; a site's own local
steps and a personal model are planned; a budget that cannot last is refused before round 1;
the same round asked again with another config is charged; a run that trained nothing is
never recorded as completed."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from fed_auc.algorithms import ALGORITHMS, build_backend
from fed_auc.algorithms.base import Draw
from fed_auc.coordinator.errors import FederationError
from fed_auc.coordinator.loop import Coordinator
from fed_auc.exchange import Broadcast
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.losses import build_loss
from fed_auc.models import build_model
from fed_auc.node.node import LocalTraining, Node
from fed_auc.privacy.accounting import LEDGER_FILE, example_plan, update_plan
from fed_auc.privacy.dp_sgd import ExampleDP
from fed_auc.privacy.update_dp import UpdateDP
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore
from fed_auc.trainable import Trainable
from fed_auc.transport.local import LocalTransport
from tests.support.dp import tiny_site

ROUNDS = 2
TINY_GROUP = build_model("tiny", norm="group").config()
SMALL = {
    "sites": 2, "rounds": ROUNDS, "local_steps": 2, "batch_size": 8, "data_scale": 0.1,
    "image_size": 16, "select": "last", "eval_every": ROUNDS,
}  # fmt: skip


def _run(tmp_path: Path, **options) -> tuple[dict, dict[str, Counter], dict[str, dict]]:
    """(summary, each site's ledger as {(q, σ): count}, each site's last DP metrics)."""
    config = ExperimentConfig(runs_dir=str(tmp_path), **SMALL, **options)
    summary = run_simulation(config)
    nodes = tmp_path / summary["run_id"] / "nodes"
    ledgers = {}
    for ledger in nodes.glob(f"*/{LEDGER_FILE}"):
        spent: Counter = Counter()
        for release in json.loads(ledger.read_text())["releases"].values():
            for q, sigma, count in release["steps"]:
                spent[(round(q, 12), round(sigma, 12))] += count
        ledgers[ledger.parent.name] = spent
    with RunStore(tmp_path) as store:
        rows = store.site_rounds(summary["run_id"])
    metrics = {
        site: json.loads(group.sort_values("round")["metrics"].iloc[-1])
        for site, group in rows.groupby("site")
    }
    return summary, ledgers, metrics


def _sample_rate(spent: Counter) -> float:
    """The site's Poisson rate q (set by its class counts, not by the planner)."""
    (q,) = {q for q, _ in spent if q < 1}
    return q


def _as_counts(plan, sigma: float) -> Counter:
    counts: Counter = Counter()
    for mechanism in plan:
        step = mechanism.step(sigma)
        counts[(round(step.q, 12), round(step.sigma, 12))] += step.count
    return counts


def _draws(algorithm: str, local_steps: int, personalize: str | None = None) -> list:
    backend = build_backend(algorithm, local_steps=local_steps)
    draws = []
    for phase in backend.phases:
        drawn = backend.private_draws(phase, local_steps)
        draws += drawn
        if personalize == "l2" and any(d.kind == "batch" for d in drawn):
            draws += [Draw("batch")] * local_steps
    return draws


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_dp_sgd_plan_equals_the_ledger_of_a_real_run(tmp_path, algorithm) -> None:
    loss = {"loss": "ce"} if algorithm == "fedavg" else {}
    _, ledgers, metrics = _run(
        tmp_path, algorithm=algorithm, dp="example", dp_clip=1.0, dp_noise=1.5, **loss
    )
    assert sorted(ledgers) == sorted(metrics) and ledgers
    for site, spent in ledgers.items():
        q, sigma = _sample_rate(spent), metrics[site]["dp_noise_multiplier"]
        plan = example_plan(_draws(algorithm, 2), q, ROUNDS)
        assert _as_counts(plan, sigma) == spent, (algorithm, site)


def test_a_personal_model_and_a_sites_own_local_steps_are_planned(tmp_path) -> None:
    _, ledgers, metrics = _run(
        tmp_path, algorithm="local_sgda", personalize="l2", dp="example", dp_clip=1.0,
        dp_noise=1.5,
    )  # fmt: skip
    for site, spent in ledgers.items():  # the personal model's steps are draws too
        q, sigma = _sample_rate(spent), metrics[site]["dp_noise_multiplier"]
        assert sum(spent.values()) == ROUNDS * 2 * 2
        assert _as_counts(example_plan(_draws("local_sgda", 2, "l2"), q, ROUNDS), sigma) == spent
    dp = ExampleDP(clip=1.0, noise_multiplier=1.0, rounds=3, local_steps=2)
    training = LocalTraining(TINY_GROUP, "auc_margin", batch_size=8, local_steps=7)
    backend = build_backend("local_sgda", local_steps=2)
    node = Node(tiny_site(), backend, training, tmp_path / "own", privacy=dp)
    assert sum(m.count for m in node.privacy.plan) == 3 * 7  # its own τ_i


@pytest.mark.slow
@pytest.mark.parametrize(
    "algorithm", sorted(a for a in ALGORITHMS if not ALGORITHMS[a].refuses_update_dp)
)
def test_update_level_plan_equals_the_ledger_of_a_real_run(tmp_path, algorithm) -> None:
    loss = {"loss": "ce"} if algorithm == "fedavg" else {}
    _, ledgers, metrics = _run(tmp_path, algorithm=algorithm, dp_clip=1.0, dp_noise=1.5, **loss)
    backend = build_backend(algorithm)
    blocks = [len(backend.reply_layout(phase).prefixes) for phase in backend.phases]
    assert ledgers
    for site, spent in ledgers.items():
        assert _as_counts(update_plan(blocks, ROUNDS), 1.5) == spent, (algorithm, site)


def test_a_target_calibrated_by_the_plan_lasts_every_planned_round(tmp_path) -> None:
    """FedSGDA-MB releases a full pass and two evaluations per step each round: planned for,
    the budget lasts all rounds (before, it lasted 1 of 20) and ends within the target."""
    summary, ledgers, metrics = _run(
        tmp_path, algorithm="fedsgda_mb", dp="example", dp_clip=1.0, target_epsilon=4.0
    )
    with RunStore(tmp_path) as store:
        rows = store.site_rounds(summary["run_id"])
    trained = rows[rows["round"] > 0]
    assert set(trained["status"]) == {"completed"} and trained["round"].max() == ROUNDS
    assert trained["dp_epsilon"].max() <= 4.0 and trained["dp_epsilon"].max() > 3.9


def test_a_budget_that_cannot_last_is_refused_before_round_1_with_the_epsilon_needed(
    tmp_path,
) -> None:
    with pytest.raises(ValueError, match=r"cannot last the run.*need ε = \d") as caught:
        _run(tmp_path, algorithm="local_sgda", dp="example", dp_clip=1.0, dp_noise=0.6,
             target_epsilon=1.0)  # fmt: skip
    assert "target_epsilon = 1.0" in str(caught.value)
    with RunStore(tmp_path) as store:  # nothing trained, nothing exported as completed
        runs = store.runs()
    assert "completed" not in set(runs["status"])
    UpdateDP(clip=1.0, noise_multiplier=0.3, target_epsilon=1.0, rounds=20)  # valid alone
    with pytest.raises(ValueError, match="cannot last the run"):
        Node(
            tiny_site(), build_backend("local_sgda", local_steps=2),
            LocalTraining(TINY_GROUP, "auc_margin", batch_size=8), tmp_path / "update",
            privacy=UpdateDP(clip=1.0, noise_multiplier=0.3, target_epsilon=1.0, rounds=20),
        )  # fmt: skip


def _request(round_: int, tensors: dict, local_steps: int, pos_ratio: float = 0.25):
    config = {"pos_ratio": [pos_ratio], "lr": 0.1, "local_steps": local_steps,
              "commit": None, "continue": None}  # fmt: skip
    return Broadcast(round_, "train", tensors, config)


@pytest.mark.parametrize("mode", ["example", "update"])
def test_the_same_round_asked_again_with_another_config_is_charged(tmp_path, mode) -> None:
    """Asked again unchanged: the same bytes, no charge. Asked again with 20 local steps
    instead of 1, or another prevalence: a new computation, fresh noise, and ε grows."""
    if mode == "example":
        dp = ExampleDP(clip=1.0, noise_multiplier=1.0, rounds=5, local_steps=20)
    else:
        dp = UpdateDP(clip=1.0, noise_multiplier=1.0, rounds=5)

    def node() -> Node:  # a restarted node each time: only its state directory carries over
        training = LocalTraining(TINY_GROUP, "auc_margin", batch_size=8)
        backend = build_backend("local_sgda", local_steps=1)
        return Node(tiny_site(), backend, training, tmp_path / "node", privacy=dp)

    tensors = node().trainable.tensors()
    first = node().train(_request(0, tensors, 1))
    again = node().train(_request(0, tensors, 1))
    assert again.metrics["dp_epsilon"] == first.metrics["dp_epsilon"]
    assert all(bool((again.tensors[n] == t).all()) for n, t in first.tensors.items())
    longer = node().train(_request(0, tensors, 20))
    assert longer.metrics["dp_epsilon"] > first.metrics["dp_epsilon"]
    other = node().train(_request(0, tensors, 1, pos_ratio=0.4))
    assert other.metrics["dp_epsilon"] > longer.metrics["dp_epsilon"]
    releases = json.loads((tmp_path / "node" / LEDGER_FILE).read_text())["releases"]
    assert [r["round"] for r in releases.values()] == [0, 0, 0]  # three releases of round 0


def test_a_run_whose_first_round_spends_every_budget_fails_instead_of_completing(tmp_path):
    """A node planned for 1 step a round, asked for 4 (a coordinator that changed the
    settings): round 1 would pass its target, nothing trains, and the run is not completed
    with a round-0 model but fails, saying why."""
    dp = ExampleDP(clip=1.0, target_epsilon=1.0, rounds=1, local_steps=1)
    training = LocalTraining(TINY_GROUP, "auc_margin", batch_size=8)
    backend = build_backend("local_sgda", local_steps=1)
    node = Node(tiny_site(), backend, training, tmp_path / "node", privacy=dp)
    server = Trainable(build_model("tiny", norm="group"), build_loss("auc_margin", 1, [0.5]))
    store = RunStore(tmp_path / "runs")
    run_id = store.create_run("local_sgda", {})
    coordinator = Coordinator(
        build_backend("local_sgda", local_steps=4), LocalTransport([node]), store, run_id,
        tmp_path / "runs" / run_id, server,
    )  # fmt: skip
    with pytest.raises(FederationError, match="round 1 trained nothing"):
        coordinator.run(3)
    coordinator.close()
