"""FedSGDA-MB / -STORM against the paper's equivalences: STORM(α = 1) ≡ MB, K = 1 is a server
GDA step, d^{(0)} = (u_t, v_t), STORM's recursion, no drift on a heterogeneous toy problem."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from benchmarks.common.toy import ToyTrainable, saddle_point, toy_sites, zero_noise
from fed_auc.algorithms import build_backend
from fed_auc.algorithms.base import model_part
from fed_auc.algorithms.fedsgda import full_gradient
from fed_auc.coordinator.screening import validate_reply
from fed_auc.losses import build_loss
from fed_auc.trainable import Trainable
from tests.support.backends import NO_EXTRAS, _batches, _run, _trainable

F64 = torch.float64


class Stream:
    """Minibatches in order plus ``full_pass`` over a fixed local split, like ``BatchStream``."""

    def __init__(self, batches, split: tuple[torch.Tensor, torch.Tensor], chunk: int = 256):
        self._batches = iter(batches)
        self.split, self.chunk = split, chunk

    def __iter__(self) -> Stream:
        return self

    def __next__(self):
        return next(self._batches)

    def full_pass(self, batch_size: int = 256):
        images, labels = self.split
        for start in range(0, len(images), self.chunk):
            yield images[start : start + self.chunk], labels[start : start + self.chunk]


def _stream(seed: int, rows: int = 12) -> Stream:
    x, y = zip(*_batches(rows // 4, seed=seed + 100, size=4), strict=True)
    return Stream(_batches(50, seed=seed), (torch.cat(x), torch.cat(y)))


def _toy_stream() -> Stream:
    return Stream(
        zero_noise(), (torch.zeros(2, dtype=torch.float64), torch.zeros(1, dtype=torch.float64))
    )


def _tiny_sites(n: int = 2) -> list[Trainable]:
    return [_trainable("auc_square") for _ in range(n)]


def _round(backend, state, round_, sites, streams, chosen=None):
    """One round, phase by phase; ``chosen[phase]`` = responding site indices (default all)."""
    replies_by_phase = {}
    for phase in backend.phases:
        broadcast = backend.plan(state, round_, phase)
        replies = []
        for k in (chosen or {}).get(phase, range(len(sites))):
            reply, _ = backend.client_update(broadcast, {}, sites[k], streams[k])
            reply.num_examples, reply.site = 12, f"site{k}"
            if sites[k].trained_groups is None:  # a toy weak site has no DenseNet groups
                validate_reply(reply, model_part(broadcast.tensors), backend.reply_layout(phase))
            replies.append(reply)
        replies_by_phase[phase] = replies
        state = backend.aggregate(state, replies, phase)
        if phase == "collect":
            replies_by_phase["estimate"] = state["estimate"]
    return state, replies_by_phase


def _train(name: str, rounds: int, **hp):
    sites, streams = _tiny_sites(), [_stream(1), _stream(2)]
    backend = build_backend(name, **hp)
    state = backend.init_server(sites[0], {"site0": 12, "site1": 12})
    for r in range(rounds):  # S'_t alternates, so STORM's momentum matters
        state, _ = _round(backend, state, r, sites, streams, {"collect": [r % 2]})
    return backend.global_tensors(state)


def test_storm_with_alpha_one_is_exactly_mb():
    hp = {"lr": 0.1, "dual_lr": 0.2, "local_steps": 2, "decay_power": 0.2, **NO_EXTRAS}
    mb = _train("fedsgda_mb", 3, **hp)
    storm = _train("fedsgda_storm", 3, storm_c=1e9, **hp)  # min(1, c/(t+1)^0.4) = 1
    for name, tensor in mb.items():
        assert torch.equal(tensor, storm[name]), name
    momentum = _train("fedsgda_storm", 3, storm_c=0.3, **hp)  # α_t < 1: a different method
    assert not torch.equal(momentum["auc/a"], mb["auc/a"])


def test_one_local_step_is_a_server_gda_step():
    """K = 1: z̄_{t+1} = (x̄_t − η_t u_t, ȳ_t + γ_t v_t), clipping and weight decay included."""
    backend = build_backend(
        "fedsgda_mb", lr=0.1, dual_lr=0.3, local_steps=1, weight_decay=1e-3, grad_clip=1e-3
    )
    sites, streams = _tiny_sites(), [_stream(1), _stream(2)]
    state = backend.init_server(sites[0], {"site0": 12, "site1": 12})
    state, _ = _round(backend, state, 0, sites, streams)  # move away from the initial point
    before = backend.global_tensors(state)
    state, seen = _round(backend, state, 1, sites, streams)
    after, estimate = backend.global_tensors(state), seen["estimate"]
    for name in sites[0].primal:
        expected = before[name] - 0.1 * estimate[name]
        torch.testing.assert_close(after[name], expected, rtol=1e-12, atol=1e-15, msg=name)
    expected = before["auc/alpha"] + 0.3 * estimate["auc/alpha"]
    torch.testing.assert_close(after["auc/alpha"], expected, rtol=1e-12, atol=1e-15)
    assert float(estimate["auc/alpha"].abs()) > 0


def test_first_local_direction_is_the_global_estimate():
    """d^{(0)} = (u_t, v_t) for any (u_t, v_t): the two minibatch terms cancel exactly."""
    backend = build_backend(
        "fedsgda_storm", lr=0.05, dual_lr=0.2, local_steps=1, weight_decay=1e-2, grad_clip=1e-4
    )
    site = _trainable("auc_square")
    state = backend.init_server(site, {"site0": 12})
    gen = torch.Generator().manual_seed(5)
    variables = [*site.primal, *site.dual]
    u = {
        n: torch.randn(site.tensors()[n].shape, generator=gen, dtype=torch.float64)
        for n in variables
    }
    broadcast = backend.plan({**state, "estimate": u}, 0, "update")
    start = broadcast.tensors
    reply, _ = backend.client_update(broadcast, {}, site, _stream(3))
    for name in site.primal:
        direction = (start[name] - reply.tensors[name]) / 0.05
        torch.testing.assert_close(direction, u[name], rtol=1e-9, atol=1e-9, msg=name)
    ascent = (reply.tensors["auc/alpha"] - start["auc/alpha"]) / 0.2
    torch.testing.assert_close(ascent, u["auc/alpha"], rtol=1e-9, atol=1e-9)


def test_fedsgda_reaches_the_global_saddle_point_where_local_sgda_drifts():
    x_star, y_star = saddle_point(toy_sites(4))

    def distance(name: str, rounds: int, **hp) -> float:
        sites = toy_sites(4)  # fresh: init_server starts from site 0's current point
        backend = build_backend(name, lr=0.05, local_steps=20, **hp, **NO_EXTRAS)
        if backend.phases == ("train",):
            state, _ = _run(backend, sites, [zero_noise() for _ in sites], rounds)
        else:
            state = backend.init_server(sites[0], {f"site{k}": 1 for k in range(4)})
            streams = [_toy_stream() for _ in sites]
            for r in range(rounds):
                state, _ = _round(backend, state, r, sites, streams)
        model = backend.global_tensors(state)
        return float(torch.cat([model["w/x"] - x_star, model["auc/alpha"] - y_star]).norm())

    assert distance("fedsgda_mb", 40) < 1e-9
    assert distance("fedsgda_storm", 40, decay_power=0.0, storm_c=0.5) < 1e-9
    assert distance("local_sgda", 300) > 0.05  # heterogeneous local steps drift


def test_storm_recursion_by_hand_over_the_collect_responders():
    hp = {"lr": 0.1, "local_steps": 2, "decay_power": 0.25, "storm_c": 0.8, **NO_EXTRAS}
    backend = build_backend("fedsgda_storm", **hp)
    sites, streams = _tiny_sites(), [_stream(1), _stream(2)]
    state = backend.init_server(sites[0], {"site0": 12, "site1": 12})
    chosen = [{}, {"collect": [1]}, {"collect": [0], "update": [1]}]  # S'_t ≠ S_t
    u, grads_at = None, {}  # grads_at[(t, k)] = site k's full gradient at z̄_t
    for t, who in enumerate(chosen):
        state, seen = _round(backend, state, t, sites, streams, who)
        collect = seen["collect"]
        for reply in collect:
            k = int(reply.site[-1])
            grads_at[(t, k)] = {n[2:]: g for n, g in reply.tensors.items() if n.startswith("g/")}
            if (t - 1, k) in grads_at:  # paired: the same site at z̄_{t−1}
                for name, g in grads_at[(t - 1, k)].items():
                    assert torch.equal(reply.tensors["gprev/" + name], g)
        mean = {
            n: sum(r.tensors["g/" + n] for r in collect) / len(collect) for n in grads_at[(t, k)]
        }
        if u is None:
            u = mean
        else:
            keep = 1 - min(1.0, 0.8 / (t + 1) ** 0.5)
            old = {n: sum(r.tensors["gprev/" + n] for r in collect) / len(collect) for n in mean}
            u = {n: keep * (u[n] - old[n]) + mean[n] for n in mean}
            assert 0 < keep < 1
        for name, value in u.items():
            torch.testing.assert_close(seen["estimate"][name], value, rtol=1e-12, atol=1e-15)
    assert backend.plan(state, 3, "update").config["lr"] == pytest.approx(0.1 / 4**0.25)


def test_reply_layouts_and_schedules():
    mb, storm = build_backend("fedsgda_mb"), build_backend("fedsgda_storm", lr=0.2, dual_lr=0.5)
    assert mb.phases == storm.phases == ("collect", "update")
    assert mb.reply_layout("collect").prefixes == ("g/",)
    assert storm.reply_layout("collect").prefixes == ("g/", "gprev/")
    assert not storm.reply_layout("collect").buffers
    assert storm.reply_layout("update").prefixes == ("",) and storm.reply_layout("update").buffers
    assert mb.step_sizes(7) == (0.1, 0.1)  # MB: constant steps, γ = η by default
    assert storm.step_sizes(31) == pytest.approx((0.2 / 2, 0.5 / 2))  # ρ = 1/5
    assert storm.momentum(0) == 1.0 and storm.momentum(31) == pytest.approx(1 / 4)
    site = _trainable("auc_square")
    state = storm.init_server(site, {"site0": 12})
    collect = storm.plan(state, 0, "collect")
    assert {n.split("/")[0] for n in collect.tensors} == {"w", "auc", "prev"}  # no buffers
    assert "local_steps" not in collect.config  # heterogeneous τ only touches the update


def test_collect_leaves_the_nodes_batchnorm_statistics_alone():
    backend = build_backend("fedsgda_storm")
    site = _trainable("auc_square")
    state = backend.init_server(site, {"site0": 12})
    for buffer in site.buffers.values():
        buffer.add_(0.5)
    before = {n: b.clone() for n, b in site.buffers.items()}
    backend.client_update(backend.plan(state, 0, "collect"), {}, site, _stream(4))
    for name, buffer in site.buffers.items():
        assert torch.equal(buffer, before[name]), name


def test_full_gradient_is_the_mean_over_all_rows_whatever_the_chunks():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(256, 1)).double()
    site = Trainable(model, build_loss("auc_square", 1, [0.25]).double())
    x, y = zip(*_batches(3, seed=9, size=4), strict=True)
    split = (torch.cat(x), torch.cat(y))
    split[1][4:] = 0.0  # chunks of 5, 5, 2 rows hold different numbers of positives
    split[1][[0, 5, 11]] = 1.0
    _, chunked = full_gradient(site, Stream([], split, chunk=5), weight_decay=0.1)
    _, whole = full_gradient(copy.deepcopy(site), Stream([], split, chunk=12), weight_decay=0.1)
    _, primal, dual = site.gradients(*split)  # one batch of all 12 rows
    direct = primal + dual
    for i, (name, param) in enumerate({**site.primal, **site.dual}.items()):
        expected = direct[i] + (0.1 * param.detach() if name in site.primal else 0.0)
        torch.testing.assert_close(whole[name], expected, rtol=1e-12, atol=1e-15, msg=name)
        torch.testing.assert_close(chunked[name], expected, rtol=1e-12, atol=1e-15, msg=name)


def test_hyperparameters_are_validated():
    with pytest.raises(ValueError, match="dual_lr"):
        build_backend("fedsgda_mb", dual_lr=0)
    with pytest.raises(ValueError, match="decay_power"):
        build_backend("fedsgda_storm", decay_power=-0.1)
    with pytest.raises(ValueError, match="storm_c"):
        build_backend("fedsgda_storm", storm_c=0)
    with pytest.raises(ValueError, match="'fedsgda_mb' has no hyperparameter 'storm_c'"):
        build_backend("fedsgda_mb", storm_c=1.0)
    with pytest.raises(ValueError, match="local_steps"):
        build_backend("fedsgda_storm", local_steps=0)


@pytest.mark.parametrize("loss_name", ["auc_square", "auc_margin", "ce"])
@pytest.mark.parametrize("labels", [1, 3])
def test_full_gradient_with_unknown_labels_equals_the_one_chunk_gradient(loss_name, labels):
    """NaN labels: each label's loss divides by ITS known rows, so chunks of 5, 5, 2 or of 4
    rows must give what autograd gives on all 12 rows at once (CheXpert-style blank labels)."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, labels)).double()
    site = Trainable(model, build_loss(loss_name, labels, [0.3] * labels).double())
    if site.is_minimax:
        site.loss.a.data.uniform_(0, 1)  # away from 0 so every term has a gradient
        site.loss.b.data.uniform_(0, 1)
        site.loss.alpha.data.uniform_(0.2, 1)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(12, 1, 4, 4, generator=gen, dtype=torch.float64)
    y = (torch.rand(12, labels, generator=gen) < 0.4).double()
    y[torch.rand(12, labels, generator=gen) < 0.35] = float("nan")
    y[0:2] = 1.0  # every label has positives, negatives and blanks, unevenly spread
    y[2:4] = 0.0
    y[5, 0] = y[6, 0] = y[7, 0] = float("nan")
    assert torch.isnan(y).any(dim=0).all()
    loss_value, primal, dual = site.gradients(x, y)  # the reference: one batch of all rows
    direct = dict(zip([*site.primal, *site.dual], primal + dual, strict=True))
    for chunk in (5, 4, 12, 1):
        value, got = full_gradient(copy.deepcopy(site), Stream([], (x, y), chunk), 0.0)
        assert value == pytest.approx(float(loss_value), rel=1e-12, abs=1e-14), chunk
        for name, expected in direct.items():
            torch.testing.assert_close(got[name], expected, rtol=1e-10, atol=1e-13, msg=name)


# -- partial training: weak sites measure and train only the output side ---------------------
class _SplitToy(ToyTrainable):
    """The toy problem with x split into an input-side ``w/x1`` and an output-side ``w/x2``;
    a weak site trains (and measures) only ``w/x2`` and α, ``w/x1`` frozen at the broadcast."""

    def __init__(self, site: ToyTrainable, weak: bool) -> None:
        super().__init__(site.A, site.B, site.mu, site.e, site.d)
        x1, x2 = torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
        self.primal = {"w/x2": x2} if weak else {"w/x1": x1, "w/x2": x2}
        self._frozen = {"w/x1": x1} if weak else {}
        self.trained_groups = ["out"] if weak else None
        self._x1 = x1

    def gradients(self, noise_x, noise_y):
        x = torch.cat([self._x1, self.primal["w/x2"]])
        y = self.dual["auc/alpha"]
        gx = self.A @ x + self.B @ y + self.e + noise_x
        gy = self.B.T @ x - self.mu * y - self.d + noise_y
        value = 0.5 * x @ self.A @ x + x @ self.B @ y - 0.5 * self.mu * y @ y
        parts = [gx[1:]] if "w/x1" not in self.primal else [gx[:1], gx[1:]]
        return value, parts, [gy.clone()]


def _split_sites(weak: tuple[bool, ...]) -> list[_SplitToy]:
    return [_SplitToy(site, w) for site, w in zip(toy_sites(len(weak)), weak, strict=True)]


def _mixed_stationary_point(sites: list[_SplitToy]) -> torch.Tensor:
    """x1 stationary for the mean of the strong sites' f_k (the only ones that train it),
    x2 and α for the mean over all sites: the per-tensor averaging's fixed point."""
    strong = [s for s in sites if "w/x1" in s.primal]
    rows = []
    for group, row in ((strong, 0), (sites, 1)):  # ∇_{x_row} mean f = 0
        A = sum(s.A for s in group) / len(group)
        e = sum(s.e for s in group) / len(group)
        rows.append((torch.cat([A[row], sites[0].B[row]]), -e[row]))
    d = sum(s.d for s in sites) / len(sites)
    rows.append((torch.cat([sites[0].B[:, 0], -sites[0].mu * torch.ones(1, dtype=F64)]), d[0]))
    matrix = torch.stack([r for r, _ in rows])
    return torch.linalg.solve(matrix, torch.stack([b for _, b in rows]))


def _split_run(name, sites, collects, **hp):
    backend = build_backend(name, lr=0.05, local_steps=5, **hp, **NO_EXTRAS)
    state = backend.init_server(sites[0], {f"site{k}": 1 for k in range(len(sites))})
    streams = [_toy_stream() for _ in sites]
    points = []
    for r, collect in enumerate(collects):
        state, seen = _round(backend, state, r, sites, streams, {"collect": collect})
        m = backend.global_tensors(state)
        points.append(torch.cat([m["w/x1"], m["w/x2"], m["auc/alpha"]]))
        yield seen, points


@pytest.mark.parametrize("name", ["fedsgda_mb", "fedsgda_storm"])
def test_a_collect_answered_by_weak_sites_only_freezes_what_they_cannot_measure(name):
    sites = _split_sites((False, True, False))  # site 1 is weak
    collects = [[0, 1, 2], [1], [1], [0, 1], [2]]  # strong+weak, weak only twice, mixed
    before = None
    for r, (seen, points) in enumerate(_split_run(name, sites, collects)):
        assert len(seen["update"]) == 3  # every site answered the update, none failed
        if collects[r] == [1]:  # no estimate for x1 this round: it stays where it was
            assert "w/x1" not in seen["estimate"] and {"w/x2", "auc/alpha"} <= set(seen["estimate"])
            assert torch.equal(points[-1][0], before[0])
            assert not torch.equal(points[-1][1:], before[1:])
        else:
            assert set(seen["estimate"]) == {"w/x1", "w/x2", "auc/alpha"}
            assert before is None or not torch.equal(points[-1][0], before[0])
        before = points[-1]


@pytest.mark.parametrize("name", ["fedsgda_mb", "fedsgda_storm"])
def test_weak_only_and_mixed_collects_reach_the_per_tensor_fixed_point(name):
    """Collects cycle through every pair of the 3 sites (one pair is the two weak ones): the
    run ends at the point where x1 is stationary for the strong sites (those that train
    it) and x2, α for all sites; before, MB's strong sites failed with a KeyError and
    STORM's aggregate raised one."""
    sites = _split_sites((False, True, True))
    target = _mixed_stationary_point(sites)
    full = torch.cat(saddle_point(sites)[0:2])  # the all-strong saddle point: a different one
    assert float((target - full).norm()) > 0.3
    pairs = [[0, 1], [1, 2], [0, 2]] * 100
    extra = {"decay_power": 0.0, "storm_c": 0.5} if name.endswith("storm") else {}
    *_, (_, points) = _split_run(name, sites, pairs, **extra)
    mean = sum(points[-30:]) / 30  # over 10 cycles; the cycle's own bias is O(lr): 0.03
    assert float((mean - target).norm()) < 0.05
    assert float((mean - full).norm()) > 0.25
