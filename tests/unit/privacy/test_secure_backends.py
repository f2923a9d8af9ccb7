"""Every backend aggregates from secure sums what it aggregates from the replies themselves.

One round on a float64 tiny DenseNet, three sites with different sizes, one of them training
only an output-side suffix (partial training): ``aggregate_secure`` on what the protocol
unmasks against ``aggregate`` on the replies. In float64 the plain aggregate is exact to
~1e-16, so the difference is secure aggregation's quantization error alone, bounded by
K · 2^-33 · (1 + max|x|) / P per value of a mean (K sites, P the smallest summed weight),
times the factor the backend applies to a mean (its server step).
"""

from __future__ import annotations

import random

import pytest
import torch

from fed_auc.algorithms import build_backend
from fed_auc.algorithms.base import model_part
from fed_auc.exchange import Broadcast
from fed_auc.exchange.compression import COMPRESS_KEY
from fed_auc.losses import build_loss
from fed_auc.models import build_model, group_names
from fed_auc.privacy.secure.client import SecureClient
from fed_auc.privacy.secure.encoding import (
    MASKED,
    SecureSum,
    site_weights_for,
    vector_layout,
    words_for,
)
from fed_auc.privacy.secure.messages import CONFIG_KEY
from fed_auc.privacy.secure.server import SecureServer
from fed_auc.trainable import Trainable
from tests.support.secure_session import advertise

SIZES = {"site0": 40, "site1": 25, "site2": 10}


class Batches:
    def __init__(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)

    def __next__(self):
        x = torch.rand(8, 1, 16, 16, generator=self.gen, dtype=torch.float64)
        y = torch.zeros(8, 1, dtype=torch.float64)
        y[:3] = 1.0
        return x, y

    def full_pass(self, batch_size: int = 256):
        yield next(Batches(99))


def trainable(loss: str) -> Trainable:
    torch.manual_seed(0)
    return Trainable(build_model("tiny").double(), build_loss(loss, 1, [0.3]).double())


def secure_total(backend, broadcasts, replies, registrations, compress="none"):
    """The protocol end to end, in-process: what the server learns (``compress``: fp16's
    32-bit words of the sites' updates, added back to the broadcast's model)."""
    weights, unit = site_weights_for(backend, registrations)
    sites = list(replies)
    nodes = {
        s: SecureClient(
            s, random.Random(s).randbytes, backend.site_weight(int(registrations[s]["n"]))
        )
        for s in sites
    }
    first = next(iter(broadcasts.values()))
    name = f"run:{first.round}:{first.phase}"  # what the node checks against the request
    server = SecureServer(name, sites, 2, None, weights, unit)
    advertise(server, nodes)
    server.collect_shares({s: nodes[s].handle("share", m)
                           for s, m in server.share_requests().items()})  # fmt: skip
    masked = {}
    for site in sites:
        config = {**server.mask_config(site), "weight": weights[site], "excluded": []}
        request = Broadcast(**{**vars(broadcasts[site]), "config": {
            **broadcasts[site].config, CONFIG_KEY: config, COMPRESS_KEY: compress}})  # fmt: skip
        sent = nodes[site].masked_reply(replies[site], request, backend)
        masked[site] = sent.tensors[MASKED].numpy().view(words_for(compress).dtype)
    answers = {s: nodes[s].handle("unmask", m)
               for s, m in server.unmask_requests(sites).items()}  # fmt: skip
    first = next(iter(broadcasts.values()))
    layout = vector_layout(backend, first)
    base = None if compress == "none" else model_part(first.tensors)
    words = server.unmask(masked, answers)
    return SecureSum.decode(words, layout, unit, sites, words_for(compress), base)


@pytest.mark.parametrize(
    ("name", "options", "loss"),
    [
        ("codasca", {"site_weighting": "examples"}, "auc_margin"),
        ("codasca", {"eta_g": 1.5}, "auc_margin"),
        ("coda_plus", {"stage_output": "average"}, "auc_margin"),
        ("fed_norm_sgda", {"momentum": 0.5}, "auc_margin"),
        ("fed_norm_sgda", {"site_weighting": "uniform"}, "auc_margin"),
        ("fedavg", {}, "ce"),
        ("fedsgda_mb", {}, "auc_margin"),
    ],
)
@pytest.mark.parametrize("compress", ["none", "fp16"])
def test_secure_aggregate_equals_the_plain_one_within_the_quantization_bound(
    name, options, loss, compress
):
    """``fp16``: 32-bit words with 2^-20 steps, stochastically rounded: one value is off by
    less than one step, so a sum of K by less than K · 2^-20 (no 1 + max|x|: updates)."""
    backend = build_backend(name, local_steps=2, lr=0.05, **options)
    models = {site: trainable(loss) for site in SIZES}
    suffix = group_names(models["site2"].model)[-2:]
    models["site2"].train_only(suffix)  # the weak site trains the output side only
    registrations = {
        site: {"n": n, "trained_groups": models[site].trained_groups} for site, n in SIZES.items()
    }
    state = backend.register_sites(backend.init_server(models["site0"], SIZES), registrations)
    for phase in backend.phases:
        broadcast = backend.plan(state, 0, phase)
        broadcast.config["pos_ratio"] = [0.3]
        if "local_steps" in broadcast.config:
            state = backend.with_local_steps(state, dict.fromkeys(SIZES, 2))
        replies = {}
        for k, site in enumerate(SIZES):
            reply, _ = backend.client_update(broadcast, {}, models[site], Batches(k))
            reply.site, reply.num_examples = site, SIZES[site]
            reply.round, reply.phase = 0, phase
            reply.trained_groups = models[site].trained_groups
            replies[site] = reply
        completed = [backend.complete_reply(r, broadcast) for r in replies.values()]
        plain = backend.aggregate(state, completed, phase)
        total = secure_total(
            backend, dict.fromkeys(SIZES, broadcast), replies, registrations, compress
        )
        secure = backend.aggregate_secure(state, total, phase)
        largest = max(float(t.abs().max()) for r in completed for t in r.tensors.values())
        quantum = len(SIZES) * 2.0**-33 * (1 + largest)  # error of one sum of π-scaled values
        if compress == "fp16":
            quantum = len(SIZES) * 2.0**-20
        mean_bound = quantum / min(w for w in total.weights.values() if w > 0)
        trainers = [total.total_weight(n) for n in total.weights if n.startswith("dc/")]
        control_bound = quantum * total.unit / min(trainers, default=1.0)
        step = 1.0 if name != "fed_norm_sgda" else 2 * 0.05  # τ_eff · γ_x^s ≤ this
        compared = 0
        for key, bound in (
            ("model", mean_bound * step),
            ("stage_sum", mean_bound),
            ("estimate", mean_bound),
            ("control", control_bound),
        ):
            for tensor_name, expected in (plain.get(key) or {}).items():
                got = secure[key][tensor_name]
                assert got.dtype == expected.dtype, tensor_name
                error = float((got - expected).abs().max())
                # BatchNorm statistics are a plain mean, the variables may take a step
                limit = mean_bound if tensor_name.startswith("buf/") else bound
                assert error <= limit, (key, tensor_name, error, limit)
                compared += 1
        assert compared >= len(plain["model"])
        state = plain


def test_under_partial_training_the_weak_sites_input_side_is_averaged_without_it():
    """A tensor only some sites trained is their weighted mean, by the per-tensor weights."""
    backend = build_backend("fedavg", local_steps=1)
    models = {site: trainable("ce") for site in SIZES}
    models["site2"].train_only(group_names(models["site2"].model)[-1:])
    registrations = {site: {"n": n} for site, n in SIZES.items()}
    state = backend.init_server(models["site0"], SIZES)
    broadcast = backend.plan(state, 0)
    replies = {}
    for k, site in enumerate(SIZES):
        reply, _ = backend.client_update(broadcast, {}, models[site], Batches(k))
        reply.site, reply.num_examples = site, SIZES[site]
        replies[site] = reply
    total = secure_total(backend, dict.fromkeys(SIZES, broadcast), replies, registrations)
    first = next(n for n in replies["site0"].tensors if n not in replies["site2"].tensors)
    expected = (40 * replies["site0"].tensors[first] + 25 * replies["site1"].tensors[first]) / 65
    assert torch.allclose(total.mean()[first], expected, rtol=0, atol=1e-9)
    assert total.total_weight(first) == pytest.approx(65)
    assert total.total_weight() == pytest.approx(75)
