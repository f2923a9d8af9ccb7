"""The backends against their papers: exact steps, control variates, drift vs. no drift."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from benchmarks.common.toy import saddle_point, toy_sites, zero_noise
from fed_auc.algorithms import ALGORITHMS, build_backend
from fed_auc.exchange import Reply
from fed_auc.trainable import Trainable
from tests.support.backends import NO_EXTRAS, _batches, _run, _trainable


def _centralized_prox_sgda(trainable: Trainable, batches, lr, gamma, wd, clip, t0, lr_decay=3.0):
    """Stagewise proximal SGDA on one machine, written out independently of the backends."""
    primal = list(trainable.primal.values())
    alpha = trainable.loss.alpha
    ref = [p.detach().clone() for p in primal]
    n_net = sum(1 for n in trainable.primal if n.startswith("w/"))
    for t, (x, y) in enumerate(batches):
        if t > 0 and t % t0 == 0:  # new stage: its reference is the current iterate
            ref = [p.detach().clone() for p in primal]
        eta = lr / lr_decay ** (t // t0)
        value = trainable.loss(trainable.model(x), y)
        grads = torch.autograd.grad(value, primal + [alpha])
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(primal, grads[:-1], strict=True)):
                if clip is not None and i < n_net:
                    g = g.clamp(-clip, clip)
                p -= eta * (g + wd * p + gamma * (p - ref[i]))
            alpha += eta * grads[-1]
            alpha.clamp_(min=0)


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("coda_plus", {}),
        ("codasca", {}),
        ("coda_plus", {"stage_output": "average"}),
        ("codasca", {"stage_output": "random_round"}),
        ("coda_plus", {"stage_output": "last", "decay_every": 3}),
        ("codasca", {"stage_output": "last", "decay_every": 3}),
    ],
)
def test_one_site_with_i_1_takes_the_steps_of_centralized_proximal_sgda(name, extra):
    batches = _batches(7)
    site = _trainable()
    reference = copy.deepcopy(site)
    hp = {"lr": 0.1, "gamma": 0.05, "weight_decay": 1e-3, "grad_clip": 0.01, "local_steps": 1}
    hp.update(extra)
    backend = build_backend(name, **hp)
    state, _ = _run(backend, [site], [iter(batches)], rounds=len(batches))
    _centralized_prox_sgda(
        reference,
        batches,
        hp["lr"],
        hp["gamma"],
        hp["weight_decay"],
        hp["grad_clip"],
        t0=hp.get("decay_every", 4000),
    )
    expected = reference.tensors()
    for name_, tensor in backend.global_tensors(state).items():
        torch.testing.assert_close(tensor, expected[name_], rtol=1e-9, atol=1e-12, msg=name_)


def test_codasca_control_variate_is_the_mean_of_the_rounds_gradients_eq7():
    """Eq. (6) as implemented equals eq. (7): c_k = (1/I) Σ_t ∇F_k^s(v_t, α_t; z_t)."""
    gamma, wd, steps = 0.05, 1e-3, 4
    backend = build_backend(
        "codasca", lr=0.05, gamma=gamma, weight_decay=wd, grad_clip=None, local_steps=steps
    )
    sites = [_trainable("auc_square"), _trainable("auc_square")]
    streams = [iter(_batches(100, seed=1)), iter(_batches(100, seed=2))]
    state, local = _run(backend, sites, streams, rounds=1)  # c, c_k now non-zero

    site, recorded = sites[0], []
    plain = site.gradients

    def recording(x, y):
        value, gp, gd = plain(x, y)
        v = [p.detach().clone() for p in site.primal.values()]
        recorded.append(([g.clone() for g in gp], [g.clone() for g in gd], v))
        return value, gp, gd

    site.gradients = recording
    broadcast = backend.plan(state, 1)
    ref = [broadcast.tensors["ref/" + n] for n in site.primal]
    reply, new_local = backend.client_update(broadcast, local[0], site, streams[0])
    assert len(recorded) == steps
    assert not any(n.startswith("dc/") for n in reply.tensors)  # Δc^k does not travel:
    derived = backend.complete_reply(reply, broadcast).tensors  # the server derives it
    for name, own in local[0]["control"].items():
        torch.testing.assert_close(derived["dc/" + name], new_local["control"][name] - own)
    names = list(site.primal) + list(site.dual)
    for i, name in enumerate(names):
        if i < len(site.primal):  # ∇_v F_k^s includes the proximal term (and weight decay)
            grads = [gp[i] + wd * v[i] + gamma * (v[i] - ref[i]) for gp, _, v in recorded]
        else:
            grads = [gd[i - len(site.primal)] for _, gd, _ in recorded]
        torch.testing.assert_close(
            new_local["control"][name], sum(grads) / steps, rtol=1e-7, atol=1e-10, msg=name
        )
    assert any(float(c.abs().max()) > 0 for c in new_local["control"].values())


def _toy_distance(name: str, local_steps: int, rounds: int) -> float:
    sites = toy_sites(4)
    backend = (
        build_backend(name, lr=0.05, local_steps=local_steps, gamma=0.0, **NO_EXTRAS)
        if name != "local_sgda"
        else build_backend(name, lr=0.05, local_steps=local_steps, **NO_EXTRAS)
    )
    state, _ = _run(backend, sites, [zero_noise() for _ in sites], rounds)
    x_star, y_star = saddle_point(sites)
    model = backend.global_tensors(state)
    return float(torch.cat([model["w/x"] - x_star, model["auc/alpha"] - y_star]).norm())


def test_codasca_reaches_the_global_saddle_point_where_local_sgda_drifts():
    codasca = _toy_distance("codasca", local_steps=20, rounds=300)
    local_sgda = _toy_distance("local_sgda", local_steps=20, rounds=300)
    assert codasca < 1e-6
    assert local_sgda > 0.05  # the fixed point of heterogeneous local steps is elsewhere
    # with one local step per round local SGDA has no drift: the gap is due to I
    assert _toy_distance("local_sgda", local_steps=1, rounds=3000) < 1e-6


def test_codasca_partial_participation_keeps_the_mean_of_every_sites_last_control_variate():
    sites = toy_sites(3)
    gen = torch.Generator().manual_seed(3)
    streams = [
        (
            (
                torch.randn(2, generator=gen, dtype=torch.float64),
                torch.randn(1, generator=gen, dtype=torch.float64),
            )
            for _ in itertools.count()
        )
        for _ in sites
    ]
    backend = build_backend("codasca", lr=0.05, local_steps=3, gamma=0.0, **NO_EXTRAS)
    state, local = _run(
        backend, sites, streams, rounds=4, participation=[[0, 1, 2], [0, 2], [1], [2]]
    )
    for name, c in state["control"].items():
        mean_of_last = sum(s["control"][name] for s in local) / 3
        torch.testing.assert_close(c, mean_of_last, rtol=1e-10, atol=1e-12)


def test_coda_plus_stage_output_is_the_average_iterate_and_the_next_reference():
    """Algorithm 2 returns (1/T) Σ_{t=1..T} (v_t, α_t); it starts and anchors stage 2."""
    site = toy_sites(1)[0]
    iterates = []  # (v_t, α_t) seen by each gradient call: t = 0..T-1
    plain = site.gradients

    def recording(x, y):
        iterates.append((site.primal["w/x"].clone(), site.dual["auc/alpha"].clone()))
        return plain(x, y)

    site.gradients = recording
    backend = build_backend(
        "coda_plus",
        lr=0.1,
        local_steps=2,
        decay_every=4,
        gamma=0.1,
        stage_output="average",
        **NO_EXTRAS,
    )
    state = backend.init_server(site, {"site0": 1})
    noise = zero_noise()
    for r in range(2):  # one stage: 2 rounds × 2 steps
        reply, _ = backend.client_update(backend.plan(state, r), {}, site, noise)
        reply.num_examples = 1
        state = backend.aggregate(state, [reply])
    assert state["stage"] == 1
    last = (reply.tensors["w/x"], reply.tensors["auc/alpha"])
    after_each_step = iterates[1:] + [last]
    expected_x = sum(v for v, _ in after_each_step) / 4
    expected_alpha = sum(a for _, a in after_each_step) / 4
    assert not torch.allclose(expected_x, last[0])  # the average is not the last iterate
    torch.testing.assert_close(state["model"]["w/x"], expected_x)
    torch.testing.assert_close(state["model"]["auc/alpha"], expected_alpha)
    torch.testing.assert_close(state["ref"]["w/x"], expected_x)
    assert backend.plan(state, 2).config["lr"] == pytest.approx(0.1 / 3)


def test_codasca_random_round_output_restarts_the_next_stage_from_one_rounds_iterate():
    sites = toy_sites(2)
    backend = build_backend(
        "codasca",
        lr=0.05,
        local_steps=2,
        decay_every=10,
        gamma=0.1,
        stage_output="random_round",
        **NO_EXTRAS,
    )
    state = backend.init_server(sites[0], {"site0": 1, "site1": 1})
    streams, local, iterates = [zero_noise(), zero_noise()], [{}, {}], []
    for r in range(5):  # one stage: 5 rounds × 2 steps
        broadcast = backend.plan(state, r)
        replies = []
        for k, site in enumerate(sites):
            reply, local[k] = backend.client_update(broadcast, local[k], site, streams[k])
            reply.num_examples, reply.site = 1, f"site{k}"
            replies.append(backend.complete_reply(reply, broadcast))
        state = backend.aggregate(state, replies)
        iterates.append(state["model"]["w/x"].clone())
    assert state["stage"] == 1
    assert any(torch.equal(state["model"]["w/x"], v) for v in iterates)
    torch.testing.assert_close(state["ref"]["w/x"], state["model"]["w/x"])
    assert all(float(c.abs().max()) == 0 for c in state["control"].values())  # reset (Alg. 4)


def test_fedavg_weights_sites_by_examples_and_local_sgda_uniformly():
    replies = [
        Reply({"w/x": torch.tensor([1.0])}, steps=1, num_examples=1),
        Reply({"w/x": torch.tensor([4.0])}, steps=1, num_examples=3),
    ]
    state = {"round": 0, "model": {"w/x": torch.tensor([0.0])}}
    fedavg = build_backend("fedavg").aggregate(state, replies)
    local = build_backend("local_sgda").aggregate(state, replies)
    assert float(fedavg["model"]["w/x"]) == pytest.approx(3.25)
    assert float(local["model"]["w/x"]) == pytest.approx(2.5)


def test_every_backend_validates_its_hyperparameters():
    assert {"fedavg", "local_sgda", "coda_plus", "codasca"} <= set(ALGORITHMS)
    with pytest.raises(ValueError, match="unknown algorithm 'fedprox'"):
        build_backend("fedprox")
    with pytest.raises(ValueError, match="lr must be"):
        build_backend("codasca", lr=-1)
    with pytest.raises(ValueError, match="local_steps"):
        build_backend("coda_plus", local_steps=0)
    with pytest.raises(ValueError, match="eta_g"):
        build_backend("codasca", eta_g=0)
    with pytest.raises(ValueError, match="'codasca' has no hyperparameter 'bogus'; valid: "):
        build_backend("codasca", bogus=1)
    with pytest.raises(ValueError, match="server_lr must be a finite number > 0, got 'abc'"):
        build_backend("fed_norm_sgda", server_lr="abc")
    with pytest.raises(ValueError, match="stage_output"):
        build_backend("coda_plus", stage_output="random_round")
