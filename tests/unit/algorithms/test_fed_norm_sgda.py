"""Fed-Norm-SGDA(+) against Algorithm 1: normalization fixes the objective, exact steps."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import random
import types

import pytest
import torch

from benchmarks.common.toy import ToyTrainable, toy_sites, weighted_saddle_point, zero_noise
from fed_auc.algorithms import ALGORITHMS, build_backend
from fed_auc.algorithms.base import model_part
from fed_auc.algorithms.fed_norm_sgda import momentum_a_norm
from fed_auc.coordinator.local_work import LocalWork
from fed_auc.coordinator.loop import Coordinator
from fed_auc.coordinator.policy import RoundPolicy
from fed_auc.coordinator.screening import validate_reply
from fed_auc.exchange import Reply
from tests.support.backends import _batches, _trainable

PLAIN = {"weight_decay": 0.0, "grad_clip": None, "lr_decay": 1.0}
F64 = torch.float64


def _two_sites() -> list[ToyTrainable]:
    """Section 3's toy: f_i = ½‖x − u_i‖² + ½ x₁y − ½(y − v_i)², u and v differ by site."""
    B = torch.tensor([[0.5], [0.0]], dtype=F64)
    sites = []
    for u, v in (((-2.0, 1.0), 1.0), ((3.0, -1.0), -1.0)):
        e, d = -torch.tensor(u, dtype=F64), -torch.tensor([v], dtype=F64)
        sites.append(ToyTrainable(torch.eye(2, dtype=F64), B, 1.0, e, d))
    return sites


def _drive(backend, sites, sizes, taus, rounds, streams=None, participation=None, tail=0):
    """plan → every site's τ_i to the backend → client_update (each sampled site with its own
    τ_i) → aggregate, as the coordinator does. ``participation[r]``: the sites of round r.
    With ``tail``, also the mean (x, y) of the last ``tail`` rounds."""
    names = [f"site{k}" for k in range(len(sites))]
    streams = streams or [zero_noise() for _ in sites]
    state = backend.init_server(sites[0], dict(zip(names, sizes, strict=True)))
    mean = 0.0
    for r in range(rounds):
        broadcast = backend.plan(state, r)
        state = backend.with_local_steps(state, dict(zip(names, taus, strict=True)))
        replies = []
        for k in participation[r] if participation else range(len(sites)):
            config = {**broadcast.config, "local_steps": taus[k]}
            request = dataclasses.replace(broadcast, config=config)
            reply, _ = backend.client_update(request, {}, sites[k], streams[k])
            reply.num_examples, reply.site = sizes[k], names[k]
            replies.append(reply)
        state = backend.aggregate(state, replies)
        if r >= rounds - tail:
            mean = mean + _point(state) / tail
    return (state, mean) if tail else state


def _shuffled_blocks(n: int, rounds: int, seed: int) -> list[list[int]]:
    """One site per round, in a fresh random order every n rounds: each site is sampled in
    exactly 1/n of the rounds, as uniform sampling is in expectation, without the drift of
    an unbalanced count."""
    rng, pattern = random.Random(seed), []
    while len(pattern) < rounds:
        pattern += [[k] for k in rng.sample(range(n), n)]
    return pattern[:rounds]


def _point(state) -> torch.Tensor:
    return torch.cat([state["model"]["w/x"], state["model"]["auc/alpha"]])


@pytest.mark.parametrize("name", ["fed_norm_sgda", "fed_norm_sgda_plus"])
def test_heterogeneous_local_steps_reach_f_where_local_sgda_reaches_the_surrogate(name):
    sites, sizes, taus = _two_sites(), [10, 10], [2, 5]
    p = [0.5, 0.5]
    surrogate = [p_i * t for p_i, t in zip(p, taus, strict=True)]  # w_i ∝ p_i τ_i
    f_star = torch.cat(weighted_saddle_point(sites, p))
    f_tilde = torch.cat(weighted_saddle_point(sites, [w / sum(surrogate) for w in surrogate]))
    assert float((f_star - f_tilde).norm()) > 0.5  # the two objectives really differ

    naive = build_backend("local_sgda", lr=0.02, site_weighting="examples", **PLAIN)
    extra = {"snapshot_every": 1} if name.endswith("plus") else {}
    normalized = build_backend(name, lr=0.02, **extra, **PLAIN)
    naive_end = _point(_drive(naive, copy.deepcopy(sites), sizes, taus, rounds=500))
    norm_end = _point(_drive(normalized, copy.deepcopy(sites), sizes, taus, rounds=500))

    assert float((naive_end - f_tilde).norm()) < 0.1 * float((naive_end - f_star).norm())
    assert float((norm_end - f_star).norm()) < 0.1 * float((norm_end - f_tilde).norm())


def test_equal_steps_full_participation_reproduce_local_sgda_exactly():
    sites = [_trainable("auc_square", seed=0) for _ in range(2)]  # same initial model
    sizes, taus, rounds = [10, 30], [3, 3], 3
    data = [_batches(taus[k] * rounds, seed=k + 1) for k in range(2)]
    start = sites[0].tensors()
    ends = {}
    for name in ("local_sgda", "fed_norm_sgda"):
        backend = build_backend(name, lr=0.05, local_steps=3, site_weighting="examples")
        streams = [iter(batches) for batches in data]
        state = _drive(backend, copy.deepcopy(sites), sizes, taus, rounds, streams)
        ends[name] = state["model"]
    assert set(ends["fed_norm_sgda"]) == set(ends["local_sgda"])
    assert any(name.startswith("buf/") for name in start)  # BatchNorm statistics included
    for name, expected in ends["local_sgda"].items():
        assert not torch.equal(expected, start[name]) or name == "auc/alpha"
        torch.testing.assert_close(ends["fed_norm_sgda"][name], expected, rtol=0, atol=1e-12)


def test_reply_carries_normalized_gradients_buffers_and_a_norm():
    site = _trainable("auc_margin")
    backend = build_backend("fed_norm_sgda", lr=0.05, local_steps=2)
    state = backend.init_server(site, {"s": 10})
    broadcast = backend.plan(state, 0)
    reply, _ = backend.client_update(broadcast, {}, site, iter(_batches(2)))
    reply.num_examples, reply.site = 10, "s"
    validate_reply(reply, model_part(broadcast.tensors), backend.reply_layout())
    assert reply.metrics["a_norm"] == 2.0 and reply.steps == 2
    assert all(n.startswith(("g/", "buf/")) for n in reply.tensors)


def _recording(site: ToyTrainable) -> list[tuple[torch.Tensor, torch.Tensor]]:
    seen = []
    original = site.gradients

    def recording(x, y):
        value, gx, gy = original(x, y)
        seen.append((gx[0].clone(), gy[0].clone()))
        return value, gx, gy

    site.gradients = recording
    return seen


@pytest.mark.parametrize(("rho", "tau"), [(0.0, 4), (0.9, 6), (0.5, 1)])
def test_momentum_pseudo_gradient_is_the_a_weighted_gradient_sum(rho, tau):
    site = _two_sites()[0]
    seen = _recording(site)
    backend = build_backend("fed_norm_sgda", lr=0.1, dual_lr=0.3, momentum=rho, **PLAIN)
    broadcast = backend.plan(backend.init_server(site, {"s": 1}), 0)
    broadcast = dataclasses.replace(broadcast, config={**broadcast.config, "local_steps": tau})
    reply, _ = backend.client_update(broadcast, {}, site, zero_noise())

    a = [(1 - rho ** (tau - k)) / (1 - rho) for k in range(tau)]  # App. A.1, from d^(t,0) = 0
    closed = (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)
    assert sum(a) == pytest.approx(closed, rel=1e-12)
    assert reply.metrics["a_norm"] == pytest.approx(closed, rel=1e-12)
    gx = sum(a_k * g for a_k, (g, _) in zip(a, seen, strict=True)) / sum(a)
    gy = sum(a_k * g for a_k, (_, g) in zip(a, seen, strict=True)) / sum(a)
    torch.testing.assert_close(reply.tensors["g/w/x"], gx, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(reply.tensors["g/auc/alpha"], gy, rtol=1e-10, atol=1e-12)


def test_momentum_a_norm_closed_form():
    assert momentum_a_norm(5, 0.0) == 5.0
    assert momentum_a_norm(10, 0.9) == pytest.approx(41.38, abs=0.01)  # notes' example


def test_alpha_is_not_projected_locally_but_clamped_at_the_server():
    site = _two_sites()[0]
    site.d = torch.tensor([5.0], dtype=F64)  # ∇_α < 0: α leaves α ≥ 0 at once
    site.loss = types.SimpleNamespace(
        dual_min=0.0, project_=lambda: site.dual["auc/alpha"].clamp_(min=0.0)
    )
    seen = _recording(site)
    backend = build_backend("fed_norm_sgda", lr=0.1, local_steps=4, **PLAIN)
    state = backend.init_server(site, {"s": 1})
    reply, _ = backend.client_update(backend.plan(state, 0), {}, site, zero_noise())
    assert float(site.dual["auc/alpha"]) < 0  # local iterate left unprojected
    mean_gy = sum(g for _, g in seen) / len(seen)
    torch.testing.assert_close(reply.tensors["g/auc/alpha"], mean_gy)  # linear in gradients
    reply.num_examples = 1
    new = backend.aggregate(state, [reply])
    assert float(new["model"]["auc/alpha"]) == 0.0


@pytest.mark.parametrize("seed", [0, 1])
def test_one_of_two_sites_per_round_reaches_f_not_the_surrogate(seed):
    """τ = (2, 5), one site a round: τ_eff must not come from the one participant (it would
    weight site i by p_i ‖ā_i‖₁ again, the surrogate F̃ 1.1 away from F*)."""
    sites, sizes, taus = _two_sites(), [10, 10], [2, 5]
    f_star = torch.cat(weighted_saddle_point(sites, [0.5, 0.5]))
    f_tilde = torch.cat(weighted_saddle_point(sites, [2 / 7, 5 / 7]))
    assert float((f_star - f_tilde).norm()) > 1.0

    backend = build_backend("fed_norm_sgda", lr=0.002, server_lr=0.01, **PLAIN)
    pattern = _shuffled_blocks(2, 600, seed)
    _, mean = _drive(backend, sites, sizes, taus, 600, participation=pattern, tail=100)
    assert float((mean - f_star).norm()) < 0.02
    assert float((mean - f_tilde).norm()) > 1.0


def test_example_weighting_one_of_three_sites_per_round_reaches_the_p_weighted_saddle():
    """Sizes 10/30/60, one site a round: the objective is Σ p_i f_i with p = (0.1, 0.3, 0.6),
    not the p²-weighted one that τ_eff and g both scaled by the participant's p_i give."""
    sites, sizes, p = toy_sites(3), [10, 30, 60], [0.1, 0.3, 0.6]
    squared = [p_i**2 / sum(q**2 for q in p) for p_i in p]
    f_star = torch.cat(weighted_saddle_point(sites, p))
    f_squared = torch.cat(weighted_saddle_point(sites, squared))
    assert float((f_star - f_squared).norm()) > 1.0

    backend = build_backend("fed_norm_sgda", lr=0.002, server_lr=0.01, **PLAIN)
    pattern = _shuffled_blocks(3, 600, seed=0)
    _, mean = _drive(backend, sites, sizes, [3, 3, 3], 600, participation=pattern, tail=99)
    assert float((mean - f_star).norm()) < 0.05
    assert float((mean - f_squared).norm()) > 1.0


@pytest.mark.parametrize(("weighting", "momentum"), [("examples", 0.0), ("uniform", 0.9)])
def test_server_step_is_unbiased_over_the_sampled_sets(weighting, momentum):
    """Eq. (3) with τ_eff over all n sites: the mean of the new model over every equally likely
    set C of |C| = 2 of 4 sites is the full-participation model (τ_i differ by site)."""
    sites, sizes, taus = toy_sites(4), [10, 30, 60, 20], [2, 5, 3, 7]
    names = [f"site{k}" for k in range(4)]
    backend = build_backend(
        "fed_norm_sgda", lr=0.05, momentum=momentum, site_weighting=weighting, **PLAIN
    )
    state = backend.init_server(sites[0], dict(zip(names, sizes, strict=True)))
    state["model"].update({"w/x": torch.tensor([1.0, -2.0], dtype=F64)})
    broadcast = backend.plan(state, 0)
    state = backend.with_local_steps(state, dict(zip(names, taus, strict=True)))
    replies = []
    for k, site in enumerate(sites):
        request = dataclasses.replace(
            broadcast, config={**broadcast.config, "local_steps": taus[k]}
        )
        reply, _ = backend.client_update(request, {}, site, zero_noise())
        reply.num_examples, reply.site = sizes[k], names[k]
        replies.append(reply)
    full = _point(backend.aggregate(state, replies))
    subsets = list(itertools.combinations(replies, 2))
    mean = sum(_point(backend.aggregate(state, list(c))) for c in subsets) / len(subsets)
    torch.testing.assert_close(mean, full, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(_point(backend.aggregate(state, list(subsets[0]))), full)


def test_fixed_tau_eff_and_buffers_over_the_participants():
    site = _two_sites()[0]
    backend = build_backend("fed_norm_sgda", lr=0.1, tau_eff=2.0, site_weighting="uniform")
    state = backend.init_server(site, {"s0": 10, "s1": 30, "s2": 60})
    x0 = torch.tensor([1.0, -1.0], dtype=F64)
    state["model"].update({"w/x": x0, "buf/m": torch.tensor([0.0])})

    def reply(gx, buf, steps):
        tensors = {
            "g/w/x": torch.tensor(gx, dtype=F64),
            "g/auc/alpha": torch.tensor([0.0], dtype=F64),
            "buf/m": torch.tensor([buf]),
        }
        return Reply(tensors, steps=steps, metrics={"a_norm": float(steps)}, num_examples=10)

    one = backend.aggregate(state, [reply([1.0, 2.0], 2.0, 3), reply([-1.0, 0.5], 9.0, 5)])
    other = backend.aggregate(state, [reply([1.0, 2.0], 2.0, 1), reply([-1.0, 0.5], 9.0, 9)])
    assert one["tau_eff"] == other["tau_eff"] == 2.0  # whatever the participants did
    torch.testing.assert_close(one["model"]["w/x"], other["model"]["w/x"])
    torch.testing.assert_close(one["model"]["buf/m"], torch.tensor([5.5]))  # their mean
    assert torch.equal(state["model"]["w/x"], x0) and state["round"] == 0  # not mutated


def test_plus_snapshot_travels_every_round_and_refreshes_every_s_rounds():
    sites, sizes = _two_sites(), [10, 30]
    backend = build_backend("fed_norm_sgda_plus", lr=0.05, snapshot_every=3, **PLAIN)
    state = backend.init_server(sites[0], {"a": 10, "b": 30})
    history = []
    for r in range(8):
        history.append(state["model"]["w/x"])
        broadcast = backend.plan(state, r)
        assert set(broadcast.tensors) == {"w/x", "auc/alpha", "snap/w/x"}
        torch.testing.assert_close(broadcast.tensors["snap/w/x"], history[3 * (r // 3)])
        state = _drive_one(backend, state, broadcast, sites, sizes, participation=[r % 2])
    assert not torch.equal(history[3], history[0])  # the test sees a real refresh
    plain = build_backend("fed_norm_sgda", **PLAIN)
    assert not any(n.startswith("snap/") for n in plain.plan(state, 0).tensors)


def _drive_one(backend, state, broadcast, sites, sizes, participation):
    replies = []
    for k in participation:
        reply, _ = backend.client_update(broadcast, {}, sites[k], zero_noise())
        reply.num_examples = sizes[k]
        replies.append(reply)
    return backend.aggregate(state, replies)


@pytest.mark.parametrize("name", ["fed_norm_sgda", "fed_norm_sgda_plus"])
def test_plus_alpha_gradient_is_taken_at_the_snapshot(name):
    extra = {"snapshot_every": 100} if name.endswith("plus") else {}
    backend = build_backend(name, lr=0.1, local_steps=4, **extra, **PLAIN)
    site = _two_sites()[0]
    state = backend.init_server(site, {"s": 1})
    snapshot = torch.tensor([2.0, -1.0], dtype=F64)
    replies = []
    for x in ([0.0, 0.0], [4.0, 3.0]):  # x differs, snapshot and α do not
        state["model"]["w/x"] = torch.tensor(x, dtype=F64)
        broadcast = backend.plan(state, 0)
        if "snap/w/x" in broadcast.tensors:
            broadcast.tensors["snap/w/x"] = snapshot
        replies.append(backend.client_update(broadcast, {}, site, zero_noise())[0])
    gy = [float(r.tensors["g/auc/alpha"]) for r in replies]
    if name == "fed_norm_sgda":
        assert gy[0] != pytest.approx(gy[1])
        return
    y, grads = 0.0, []  # y_{k+1} = y_k + η ∇_y f(x̂, y_k), ∇_y f = 0.5 x̂₁ − y − d
    for _ in range(4):
        grads.append(0.5 * 2.0 - y - float(site.d))
        y += 0.1 * grads[-1]
    assert gy[0] == pytest.approx(sum(grads) / 4, rel=1e-12)
    assert gy[1] == pytest.approx(gy[0], rel=1e-12)


def test_real_model_dual_gradient_at_a_snapshot_spares_the_batchnorm_statistics():
    site = _trainable("auc_margin")
    x, y = _batches(1)[0]
    site.loss.alpha.data.fill_(0.3)
    site.model.train()
    before = {n: b.clone() for n, b in site.model.named_buffers()}
    _, _, current = site.gradients(x, y)
    for n, b in site.model.named_buffers():  # put the statistics back after the real pass
        b.copy_(before[n])
    here = site.dual_gradients_at({**site.primal}, x, y)
    torch.testing.assert_close(here, current)
    for n, b in site.model.named_buffers():
        assert torch.equal(b, before[n]), n
    moved = {n: t.detach() + 0.5 for n, t in site.primal.items()}
    assert not torch.allclose(site.dual_gradients_at(moved, x, y)[0], current[0])

    backend = build_backend("fed_norm_sgda_plus", lr=0.05, local_steps=2)
    broadcast = backend.plan(backend.init_server(site, {"s": 10}), 0)
    reply, _ = backend.client_update(broadcast, {}, site, iter(_batches(2)))
    reply.num_examples, reply.site = 10, "s"
    validate_reply(reply, model_part(broadcast.tensors), backend.reply_layout())


def test_hyperparameters_are_validated():
    assert {"fed_norm_sgda", "fed_norm_sgda_plus"} <= set(ALGORITHMS)
    assert build_backend("fed_norm_sgda").site_weighting == "examples"
    for name, bad in [
        ("dual_lr", 0.0),
        ("server_lr", -1.0),
        ("server_dual_lr", float("nan")),
        ("momentum", 1.0),
        ("momentum", -0.1),
        ("tau_eff", "participants"),
        ("tau_eff", 0),
        ("tau_eff", True),
        ("site_weighting", "steps"),
        ("lr", -1.0),
    ]:
        with pytest.raises(ValueError, match=name):
            build_backend("fed_norm_sgda", **{name: bad})
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="snapshot_every"):
            build_backend("fed_norm_sgda_plus", snapshot_every=bad)
    with pytest.raises(ValueError, match="no hyperparameter 'snapshot_every'"):
        build_backend("fed_norm_sgda", snapshot_every=5)  # only the + variant has a snapshot


class _ToyTransport:
    """Sites of the toy problem behind the coordinator's transport interface."""

    def __init__(self, sites, sizes):
        pairs = zip(sites, sizes, strict=True)
        self.sites = {f"site{k}": pair for k, pair in enumerate(pairs)}
        self.asked: list[dict[str, int]] = []

    def register(self):
        counts = {"positives": [1], "known": [2], "trained_groups": None}
        return {name: {"n": size, **counts} for name, (_, size) in self.sites.items()}

    def train(self, requests):
        self.asked.append({s: b.config["local_steps"] for s, b in requests.items()})
        answers = {}
        for name, broadcast in requests.items():
            site, size = self.sites[name]
            reply, _ = self.backend.client_update(broadcast, {}, site, zero_noise())
            reply.site, reply.round, reply.phase = name, broadcast.round, broadcast.phase
            reply.num_examples = size
            answers[name] = reply
        return answers


class _NoStore:
    def record_round(self, run_id, record):
        pass

    def add_event(self, *args, **kwargs):
        pass


def _coordinated(tmp_path, participation, local_work, rounds=6):
    sites, sizes = toy_sites(4), [10, 30, 60, 20]
    backend = build_backend("fed_norm_sgda", lr=0.01, local_steps=4, **PLAIN)
    transport = _ToyTransport(sites, sizes)
    transport.backend = backend
    coordinator = Coordinator(
        backend, transport, _NoStore(), "run", tmp_path, sites[0],
        RoundPolicy(participation=participation, seed=3, local_work=local_work),
    )  # fmt: skip
    told, tau_eff = [], []
    original = backend.with_local_steps

    def recording(state, steps):
        told.append(dict(steps))
        return original(state, steps)

    backend.with_local_steps = recording
    for _ in range(rounds):
        coordinator.run_round(evaluate=False)
        tau_eff.append(coordinator.state["tau_eff"])
    coordinator.close()
    return told, tau_eff, transport.asked


@pytest.mark.parametrize(
    "work", [LocalWork(fixed={"site0": 2, "site2": 9}), LocalWork(low=1, high=12, seed=5)]
)
def test_coordinator_tells_every_sites_tau_and_tau_eff_ignores_who_was_sampled(tmp_path, work):
    told, tau_eff, asked = _coordinated(tmp_path / "half", 0.5, work)
    full_told, full_tau_eff, _ = _coordinated(tmp_path / "full", 1.0, work)
    assert all(len(a) == 2 for a in asked)  # half the sites a round ...
    for round_, steps in enumerate(told):  # ... but the backend hears of all four
        assert sorted(steps) == ["site0", "site1", "site2", "site3"]
        assert all(steps[s] == tau for s, tau in asked[round_].items())  # what they ran
    assert told == full_told and tau_eff == pytest.approx(full_tau_eff, rel=1e-15)
    if work.low is not None:
        assert len(set(tau_eff)) > 1  # τ_i^(t) drawn per round: so is τ_eff^(t)
