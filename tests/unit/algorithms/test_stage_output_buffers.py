"""Issue 18 item 8: a stage output takes its BatchNorm statistics (``buf/`` tensors) from the
same round (CODASCA ``random_round``) or the same average (CODA+ ``average``) as its weights,
not from the stage's last round.

The toy's buffer ``buf/m`` is a running statistic that follows the weights (it is set to
x_0 after every local step), so each round's aggregated buffer differs from the others.
"""

from __future__ import annotations

import torch

from benchmarks.common.toy import ToyTrainable, toy_sites, zero_noise
from fed_auc.algorithms import build_backend

NO_EXTRAS = {"weight_decay": 0.0, "grad_clip": None, "gamma": 0.0}
WEIGHTS = ("w/x", "auc/alpha")


class BufferedToy(ToyTrainable):
    def __init__(self, site: ToyTrainable) -> None:
        super().__init__(site.A, site.B, site.mu, site.e, site.d)
        self.buffers = {"buf/m": torch.zeros(1, dtype=torch.float64)}

    def gradients(self, noise_x, noise_y):
        out = super().gradients(noise_x, noise_y)
        self.buffers["buf/m"].copy_(self.primal["w/x"][:1])  # a statistic of this step
        return out


def _models(name: str, rounds: int, boundary: bool, **hyper):
    """``rounds`` rounds, 2 sites; the aggregated model after each. With ``boundary`` the
    stage ends after the last round (its model is then the stage output), else it never does
    (the same rounds: the reservoir draw depends on the seed, stage and round only)."""
    sites = [BufferedToy(s) for s in toy_sites(2)]
    steps = 3
    decay_every = rounds * steps if boundary else 10**6  # counted in local steps
    backend = build_backend(name, lr=0.1, local_steps=steps, decay_every=decay_every, **hyper,
                            **NO_EXTRAS)  # fmt: skip
    state = backend.init_server(sites[0], {"s0": 1, "s1": 1})
    local, noise, models = [{}, {}], zero_noise(), []
    for r in range(rounds):
        broadcast = backend.plan(state, r)
        replies = []
        for k, site in enumerate(sites):
            reply, local[k] = backend.client_update(broadcast, local[k], site, noise)
            reply.site, reply.num_examples = f"s{k}", 1
            replies.append(backend.complete_reply(reply, broadcast))
        state = backend.aggregate(state, replies)
        models.append({n: t.clone() for n, t in state["model"].items()})
    assert state["stage"] == (1 if boundary else 0)
    return models


def test_codasca_random_round_takes_weights_and_buffers_from_the_same_round():
    earlier = 0
    for seed in range(10):
        rounds = _models("codasca", 5, False, stage_output="random_round", seed=seed)
        output = _models("codasca", 5, True, stage_output="random_round", seed=seed)[-1]
        chosen = [r for r, m in enumerate(rounds) if torch.equal(output["w/x"], m["w/x"])]
        assert len(chosen) == 1, "the output's weights are one round's weights"
        for name in (*WEIGHTS, "buf/m"):
            assert torch.equal(output[name], rounds[chosen[0]][name]), (seed, name)
        earlier += chosen[0] < len(rounds) - 1
    assert earlier > 0  # a round before the last was drawn: the check is not vacuous
    assert len({float(m["buf/m"]) for m in rounds}) == len(rounds)  # every round's differ


def test_coda_plus_average_takes_buffers_from_the_stage_average():
    rounds = _models("coda_plus", 4, False, stage_output="average")
    output = _models("coda_plus", 4, True, stage_output="average")[-1]
    mean = sum(m["buf/m"] for m in rounds) / len(rounds)  # the rounds' aggregated statistics
    torch.testing.assert_close(output["buf/m"], mean)
    assert not torch.allclose(output["buf/m"], rounds[-1]["buf/m"])  # not the last round's
    assert not torch.allclose(output["w/x"], rounds[-1]["w/x"])  # the weights are averaged too
