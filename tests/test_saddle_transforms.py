"""CODASCA and CODA+ on the toy min-max problem with a known saddle point, under random
partial participation × {plain, DP clipping, median, trimmed mean} × {all strong, one weak
site}: the run ends at the right saddle point, or the combination is refused by name.

The driver calls what the node and the coordinator call, in their order: ``client_update``,
``Privacy.privatize`` and ``reply_sent`` (node), ``complete_reply``, ``Aggregation.apply`` and
``aggregate`` (coordinator), with the trained groups registered up front. The reference saddle
point is solved independently: for each coordinate, the mean over the sites that train it of
∇f_k is zero (with a weak site, the input-side coordinate is trained by the strong sites only).
"""

from __future__ import annotations

import random

import pytest
import torch

from fed_auc.algorithms import build_backend
from fed_auc.privacy import Privacy
from fed_auc.robust import Aggregation
from tests.toy import (
    ToyTrainable,
    saddle_point,
    toy_sites,
    weighted_saddle_point,
    zero_noise,
)

STEM = "w/net.features.conv0.weight"  # x_0: the input side (layer group "stem")
HEAD = "w/net.class_layers.out.weight"  # x_1: the output side ("classifier")
ALPHA = "auc/alpha"
NO_EXTRAS = {"weight_decay": 0.0, "grad_clip": None, "gamma": 0.0}
SITES = 6
TRANSFORMS = {
    "plain": (None, "mean"),
    "dp_clip": (0.5, "mean"),  # clipping without noise
    "median": (None, "median"),
    "trimmed_mean": (None, "trimmed_mean:0.2"),
}


class GroupedToy(ToyTrainable):
    """The toy with x split into two layer groups; a weak site trains only the head."""

    def __init__(self, site: ToyTrainable, weak: bool) -> None:
        super().__init__(site.A, site.B, site.mu, site.e, site.d)
        x = torch.zeros(1, dtype=torch.float64)
        self.primal = {STEM: x.clone(), HEAD: x.clone()}
        self._frozen = {}
        if weak:
            self._frozen = {STEM: self.primal.pop(STEM)}
            self.trained_groups = ["classifier"]

    def _x(self) -> torch.Tensor:
        both = {**self._frozen, **self.primal}
        return torch.cat([both[STEM], both[HEAD]])

    def gradients(self, noise_x, noise_y):
        x, y = self._x(), self.dual[ALPHA]
        gx = self.A @ x + self.B @ y + self.e + noise_x
        gy = self.B.T @ x - self.mu * y - self.d + noise_y
        grads = {STEM: gx[:1].clone(), HEAD: gx[1:].clone()}
        return torch.zeros(()), [grads[n] for n in self.primal], [gy.clone()]


def reference_saddle(sites: list[ToyTrainable], weak: set[int]) -> torch.Tensor:
    """(x_0, x_1, y) where each coordinate's gradient, averaged over its trainers, is 0."""
    rows, rhs = [], []
    for coord in range(2):  # ∇_x f_k = A_k x + B y + e_k
        trainers = [s for k, s in enumerate(sites) if coord == 1 or k not in weak]
        mean_a = sum(s.A[coord] for s in trainers) / len(trainers)
        rows.append(torch.cat([mean_a, sites[0].B[coord]]))
        rhs.append(-sum(s.e[coord] for s in trainers) / len(trainers))
    b, mu = sites[0].B, sites[0].mu  # ∇_y f_k = Bᵀx − μ y − d_k, every site trains y
    rows.append(torch.cat([b[:, 0], torch.tensor([-mu], dtype=torch.float64)]))
    rhs.append(sum(s.d[0] for s in sites) / len(sites))
    return torch.linalg.solve(torch.stack(rows), torch.stack(rhs))


def run_toy(algorithm, transform, weak, rounds, seed=0, **hyper):
    clip, aggregation = TRANSFORMS[transform]
    plain_sites = toy_sites(SITES)
    sites = [GroupedToy(s, k in weak) for k, s in enumerate(plain_sites)]
    names = [f"site{k}" for k in range(SITES)]
    backend = build_backend(algorithm, **{**NO_EXTRAS, **hyper})
    robust = Aggregation.parse(aggregation)
    robust.check_backend(backend)  # refused combinations stop here, by name
    privacy = Privacy(clip) if clip is not None else None
    server = GroupedToy(plain_sites[0], weak=False)
    state = backend.init_server(server, dict.fromkeys(names, 10))
    registrations = {
        n: {"n": 10, "trained_groups": s.trained_groups} for n, s in zip(names, sites, strict=True)
    }
    state = backend.register_sites(state, registrations)
    local, streams = [{} for _ in sites], [zero_noise() for _ in sites]
    rng = random.Random(seed)
    for r in range(rounds):
        chosen = sorted(rng.sample(range(SITES), SITES // 2))  # 50 % participation
        broadcast = backend.plan(state, r)
        replies = []
        for k in chosen:
            reply, local[k] = backend.client_update(broadcast, local[k], sites[k], streams[k])
            reply.site, reply.num_examples = names[k], 10
            reply.trained_groups = sites[k].trained_groups
            if privacy is not None:
                sent = privacy.privatize(reply, broadcast, names[k])
                local[k] = backend.reply_sent(reply, sent, broadcast, local[k])
                reply = sent
            replies.append(backend.complete_reply(reply, broadcast))
        state = backend.aggregate(state, robust.apply(replies))
    model = backend.global_tensors(state)
    found = torch.cat([model[STEM], model[HEAD], model[ALPHA]])
    return float((found - reference_saddle(plain_sites, set(weak))).norm())


CODASCA = {"lr": 0.05, "local_steps": 10, "decay_every": 10**6}  # one stage: no c reset
# CODA+ has no control variates: I = 1 (no client drift) and a decaying step for the noise of
# sampling 3 of 6 heterogeneous sites, so it is within 0.01 (measured 0.005), not exact
CODA_PLUS = {"lr": 0.05, "local_steps": 1, "decay_every": 300, "lr_decay": 1.5}
REFUSED = {"codasca": "its control variates", "coda_plus": "a coordinate-wise median"}
TOLERANCE = {"codasca": 1e-6, "coda_plus": 0.01}
ROUNDS = {"codasca": 1000, "coda_plus": 3000}


@pytest.mark.parametrize("weak", [(), (5,)], ids=["all_strong", "one_weak"])
@pytest.mark.parametrize("transform", sorted(TRANSFORMS))
@pytest.mark.parametrize("algorithm", ["codasca", "coda_plus"])
def test_toy_ends_at_the_saddle_point_or_is_refused(algorithm, transform, weak):
    hyper = CODASCA if algorithm == "codasca" else CODA_PLUS
    if transform in ("median", "trimmed_mean"):
        with pytest.raises(ValueError, match=f"with '{algorithm}': {REFUSED[algorithm]}"):
            run_toy(algorithm, transform, weak, rounds=1, **hyper)
        return
    distance = run_toy(algorithm, transform, weak, rounds=ROUNDS[algorithm], **hyper)
    assert distance < TOLERANCE[algorithm]


# -- item 6: example-weighted CODASCA solves the example-weighted objective ------------------
@pytest.mark.parametrize("participation", [1.0, 0.5])
def test_codasca_example_weighting_reaches_the_example_weighted_saddle_point(participation):
    sites = toy_sites(4)
    sizes = [10, 30, 60, 100]
    backend = build_backend("codasca", lr=0.05, local_steps=10, site_weighting="examples",
                            **NO_EXTRAS)  # fmt: skip
    names = [f"site{k}" for k in range(4)]
    state = backend.init_server(sites[0], dict(zip(names, sizes, strict=True)))
    local, streams, rng = [{} for _ in sites], [zero_noise() for _ in sites], random.Random(1)
    for r in range(1500):
        chosen = sorted(rng.sample(range(4), int(4 * participation)))
        broadcast = backend.plan(state, r)
        replies = []
        for k in chosen:
            reply, local[k] = backend.client_update(broadcast, local[k], sites[k], streams[k])
            reply.site, reply.num_examples = names[k], sizes[k]
            replies.append(backend.complete_reply(reply, broadcast))
        state = backend.aggregate(state, replies)
    x, y = weighted_saddle_point(sites, [n / sum(sizes) for n in sizes])
    ux, uy = saddle_point(sites)
    model = state["model"]
    found = torch.cat([model["w/x"], model["auc/alpha"]])
    assert float((torch.cat([x, y]) - torch.cat([ux, uy])).norm()) > 0.1  # they differ
    # sampled rounds average unequal subsets: slower, but to the same point (5.8e-5 at 1500)
    assert float((found - torch.cat([x, y])).norm()) < (1e-6 if participation == 1 else 1e-4)


# -- item 4: CODA+ stage average with rounds only weak sites answered ------------------------
@pytest.mark.parametrize("order", [("strong", "weak"), ("weak", "strong")])
def test_coda_plus_average_over_a_stage_with_a_weak_only_round(order):
    plain = toy_sites(2)
    sites = {"strong": GroupedToy(plain[0], weak=False), "weak": GroupedToy(plain[1], weak=True)}
    backend = build_backend("coda_plus", lr=0.1, local_steps=1, decay_every=2,
                            stage_output="average", **NO_EXTRAS)  # fmt: skip
    state = backend.init_server(sites["strong"], {"strong": 1, "weak": 1})
    noise, ends = zero_noise(), []
    for r, who in enumerate(order):  # one stage: 2 rounds of 1 step, one site each
        broadcast = backend.plan(state, r)
        reply, _ = backend.client_update(broadcast, {}, sites[who], noise)
        reply.site, reply.num_examples = who, 1
        reply.trained_groups = sites[who].trained_groups
        before = state["model"]  # a variable the site did not train stays where it was
        ends.append({n: reply.tensors.get(n, before[n]).clone() for n in (STEM, HEAD, ALPHA)})
        state = backend.aggregate(state, [reply])
    assert state["stage"] == 1
    for name in (STEM, HEAD, ALPHA):  # Algorithm 2: the mean of the iterates after each step
        torch.testing.assert_close(state["model"][name], (ends[0][name] + ends[1][name]) / 2)
    assert not torch.equal(ends[0][STEM], torch.zeros(1, dtype=torch.float64)) or not (
        torch.equal(ends[1][STEM], torch.zeros(1, dtype=torch.float64))
    )  # the strong round moved the stem, so the average is not trivially 0
