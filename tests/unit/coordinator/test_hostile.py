"""Hostile or broken replies are rejected with an event and never averaged; the run goes on."""

from __future__ import annotations

import math
import re

import pytest
import torch

from benchmarks.common.toy import toy_sites, zero_noise
from fed_auc.algorithms import build_backend
from fed_auc.algorithms.base import Backend
from fed_auc.algorithms.fed_norm_sgda import momentum_a_norm
from fed_auc.coordinator.screening import InvalidReply, validate_answer
from fed_auc.data.synthetic import DEFAULT_PROFILES
from fed_auc.exchange import Broadcast, Reply
from fed_auc.exchange.compression import SCALE
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import load_torch
from fed_auc.node.host import NodeHost
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore
from fed_auc.trainable import BUFFER

SMALL = {"sites": 3, "rounds": 2, "local_steps": 2, "batch_size": 8, "data_scale": 0.15}
BAD = DEFAULT_PROFILES[1].name
OTHER = DEFAULT_PROFILES[0].name


def first_weight(reply) -> str:
    return next(n for n in reply.tensors if n.startswith("w/"))


def nan(reply):
    reply.tensors[first_weight(reply)] = torch.full_like(reply.tensors[first_weight(reply)], 1e0)
    reply.tensors[first_weight(reply)][0] = float("nan")


def inf(reply):
    reply.tensors["auc/a"] = torch.full_like(reply.tensors["auc/a"], float("inf"))


def renamed(reply):
    reply.tensors["w/evil"] = reply.tensors.pop(first_weight(reply))


def reshaped(reply):
    name = first_weight(reply)
    reply.tensors[name] = reply.tensors[name].flatten()[:-1]


def retyped(reply):
    name = first_weight(reply)
    reply.tensors[name] = reply.tensors[name].half()


def oversized(reply):
    reply.tensors["w/padding"] = torch.zeros(5_000_000)


def absurd_norm(reply):
    for name in [n for n in reply.tensors if n.startswith("w/")]:
        reply.tensors[name] = reply.tensors[name] * 1e6


def impostor(reply):
    reply.site = OTHER


def stale(reply):
    reply.round = reply.round - 1


def zero_steps(reply):
    reply.steps = 0


def too_many_steps(reply):
    reply.steps = 10**6


def inflated_examples(reply):
    reply.num_examples = 10**9


def absurd_a_norm(reply):
    reply.metrics["a_norm"] = 1e12


def absurd_gradient(reply):
    for name in [n for n in reply.tensors if n.startswith("g/")]:
        reply.tensors[name] = reply.tensors[name] * 1e6


TAMPERINGS = {
    "nan": (nan, "contains NaN or infinite values"),
    "inf": (inf, "'auc/a' contains NaN or infinite"),
    "wrong name": (renamed, "missing tensor"),
    "wrong shape": (reshaped, "has shape"),
    "wrong dtype": (retyped, "has dtype torch.float16, expected torch.float32"),
    "oversized": (oversized, "oversized or malformed payload"),
    "absurd norm": (absurd_norm, "exceeds the bound"),
    "duplicated site id": (impostor, f"claims to come from site '{OTHER}'"),
    "wrong round": (stale, "phase 'train', but round"),
    "zero steps": (zero_steps, "steps = 0, outside 1 ≤ steps ≤ 2"),
    "too many steps": (too_many_steps, "steps = 1000000, outside 1 ≤ steps ≤ 2"),
    "inflated num_examples": (inflated_examples, "but the site registered"),
}


def run(tmp_path, monkeypatch, change, **changes) -> dict:
    """A simulation where site BAD answers with ``change``: its request host (what the
    transport hands each request to) is replaced, so whatever it returns reaches the
    coordinator as a hostile node's answer would."""
    original = NodeHost.train

    def train(self, broadcast):
        if self.hosting.name != BAD:
            return original(self, broadcast)
        return change(self, broadcast, original)

    monkeypatch.setattr(NodeHost, "train", train)
    config = ExperimentConfig(runs_dir=str(tmp_path), max_update_norm=1e3, **{**SMALL, **changes})
    return run_simulation(config)


def without_bad_site(tmp_path_factory, name: str, **changes) -> dict[str, torch.Tensor]:
    """The final model of the same run where the bad site's node fails outright every round."""
    monkeypatch = pytest.MonkeyPatch()

    def fail(self, broadcast, original):
        raise RuntimeError("node down")

    try:
        summary = run(tmp_path_factory.mktemp(name), monkeypatch, fail, **changes)
    finally:
        monkeypatch.undo()
    return load_torch(summary["model_path"])["state_dict"]


@pytest.fixture(scope="module")
def excluded(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The reference of a hostile reply: as if the site had not answered."""
    return without_bad_site(tmp_path_factory, "excluded")


@pytest.mark.parametrize("kind", list(TAMPERINGS))
def test_hostile_reply_is_rejected_recorded_and_never_averaged(
    tmp_path, monkeypatch, excluded, kind
) -> None:
    tamper, message = TAMPERINGS[kind]

    def hostile(self, broadcast, original):
        reply = original(self, broadcast)
        tamper(reply)
        return reply

    summary = run(tmp_path, monkeypatch, hostile)
    with RunStore(tmp_path) as store:
        rows = store.site_rounds(summary["run_id"])
        statuses = rows[(rows["site"] == BAD) & (rows["round"] > 0)]["status"]
        assert set(statuses) == {"rejected"}
        events = store.events(summary["run_id"])
        rejected = events[events["site"] == BAD]["message"]
        assert len(rejected) == 2 and rejected.str.contains(message, regex=False).all(), rejected
        assert store.run(summary["run_id"])["status"] == "completed"
    model = load_torch(summary["model_path"])["state_dict"]
    for name, tensor in excluded.items():  # as if the site had not answered at all
        assert torch.equal(model[name], tensor), name


@pytest.fixture(scope="module")
def silent(tmp_path_factory):
    """Final model of a run where the bad site's node fails in the given phases (cached)."""
    cache: dict[tuple[str, str], dict[str, torch.Tensor]] = {}

    def reference(algorithm: str, phase: str) -> dict[str, torch.Tensor]:
        if (algorithm, phase) not in cache:
            monkeypatch = pytest.MonkeyPatch()

            def fail(self, broadcast, original):
                if broadcast.phase != phase:
                    return original(self, broadcast)
                raise RuntimeError("node down")

            try:
                runs = tmp_path_factory.mktemp(f"silent-{algorithm}-{phase}")
                summary = run(runs, monkeypatch, fail, algorithm=algorithm)
            finally:
                monkeypatch.undo()
            cache[algorithm, phase] = load_torch(summary["model_path"])["state_dict"]
        return cache[algorithm, phase]

    return reference


SCALAR_TAMPERINGS = {  # (algorithm, phase, tamper, message): counts and scalars, per backend
    "fed_norm_sgda a_norm": ("fed_norm_sgda", "train", absurd_a_norm, "a_norm = 1e+12, but 2"),
    "fed_norm_sgda direction": ("fed_norm_sgda", "train", absurd_gradient, "exceeds the bound"),
    "fedsgda gradient": ("fedsgda_mb", "collect", absurd_gradient, "exceeds the bound"),
    "fedsgda steps": ("fedsgda_mb", "update", zero_steps, "steps = 0, outside"),
}


@pytest.mark.parametrize("kind", list(SCALAR_TAMPERINGS))
def test_hostile_scalars_of_other_backends_are_rejected_and_never_averaged(
    tmp_path, monkeypatch, silent, kind
) -> None:
    algorithm, phase, tamper, message = SCALAR_TAMPERINGS[kind]

    def hostile(self, broadcast, original):
        reply = original(self, broadcast)
        if broadcast.phase == phase:
            tamper(reply)
        return reply

    summary = run(tmp_path, monkeypatch, hostile, algorithm=algorithm)
    with RunStore(tmp_path) as store:
        rows = store.site_rounds(summary["run_id"])
        assert set(rows[(rows["site"] == BAD) & (rows["round"] > 0)]["status"]) == {"rejected"}
        events = store.events(summary["run_id"])
        rejected = events[events["site"] == BAD]["message"]
        assert len(rejected) == 2, rejected
        assert rejected.str.contains(f"{phase}: rejected: ", regex=False).all(), rejected
        assert rejected.str.contains(message, regex=False).all(), rejected
    model = load_torch(summary["model_path"])["state_dict"]
    for name, tensor in silent(algorithm, phase).items():  # as if the site had not answered
        assert torch.equal(model[name], tensor), name


def test_an_answer_that_is_not_a_reply_is_rejected(tmp_path, monkeypatch) -> None:
    summary = run(tmp_path, monkeypatch, lambda self, b, original: {"w/x": "payload"})
    with RunStore(tmp_path) as store:
        events = store.events(summary["run_id"])
        assert events["message"].str.contains("is a dict, not a Reply").sum() == 2


# -- counts and scalars: each checked against what the request asked -----------------------
ASKED = 3  # local steps asked of the site
REGISTERED = 10  # training examples the site registered


class ToyStream:
    """Zero gradient noise, and a one-chunk full pass (FedSGDA's collect phase)."""

    def __init__(self) -> None:
        self._noise = zero_noise()

    def __next__(self):
        return next(self._noise)

    def full_pass(self, batch_size: int = 256):
        yield next(zero_noise())


def honest(name: str, phase: str = "train", **options) -> tuple[Backend, Broadcast, Reply]:
    """A backend, a request of ``phase`` and the honest reply of a toy site to it."""
    backend = build_backend(name, lr=0.1, local_steps=ASKED, **options)
    site, other = toy_sites(2)
    state = backend.init_server(site, {"a": REGISTERED, "b": 20})
    if phase == "update":  # the update phase needs the collect phase's estimate
        collect = backend.plan(state, 0, "collect")
        reply, _ = backend.client_update(collect, {}, other, ToyStream())
        state = backend.aggregate(state, [reply], "collect")
    request = backend.plan(state, 0, phase)
    reply, _ = backend.client_update(request, {}, site, ToyStream())
    reply.site, reply.round, reply.phase, reply.num_examples = "a", 0, phase, REGISTERED
    return backend, request, reply


def check(backend: Backend, request: Broadcast, reply: Reply, bound: float | None = None):
    """What the coordinator runs on every answer (``Coordinator.screen``)."""
    layout = backend.reply_layout(request.phase)
    validate_answer(
        reply, "a", request, layout, bound, backend=backend, registered_examples=REGISTERED
    )


TRAINING = [  # (backend, phase, options): every reply of local steps
    ("codasca", "train", {}),
    ("coda_plus", "train", {}),
    ("coda_plus", "train", {"stage_output": "average"}),
    ("local_sgda", "train", {}),
    ("fedavg", "train", {}),
    ("fed_norm_sgda", "train", {}),
    ("fed_norm_sgda", "train", {"momentum": 0.9}),
    ("fed_norm_sgda_plus", "train", {}),
    ("fedsgda_mb", "update", {}),
    ("fedsgda_storm", "update", {}),
]
COLLECT = [("fedsgda_mb", "collect", {}), ("fedsgda_storm", "collect", {})]
STEPS_OUT_OF_RANGE = "outside 1 ≤ steps ≤ 3 (the local steps asked for)"


def _ids(cases):
    return [
        f"{name}-{phase}-{options}" if options else f"{name}-{phase}"
        for name, phase, options in cases
    ]


def _scale_update(reply: Reply, request: Broadcast, factor: float) -> None:
    """Multiply what the reply moves the model by: its change of the iterates, or its
    gradients (every float tensor that is not an iterate or a buffer)."""
    for name, tensor in reply.tensors.items():
        if name.startswith(BUFFER):
            continue
        start = request.tensors.get(name)
        reply.tensors[name] = (
            tensor * factor if start is None else start + (tensor - start) * factor
        )


@pytest.mark.parametrize(
    ("name", "phase", "options"), TRAINING + COLLECT, ids=_ids(TRAINING + COLLECT)
)
def test_an_honest_reply_passes_every_check(name, phase, options) -> None:
    backend, request, reply = honest(name, phase, **options)
    norm = backend.update_norm(reply, request)
    assert norm is not None and 0 < norm < 1e3, norm
    check(backend, request, reply, bound=norm * 1.0001)
    with pytest.raises(InvalidReply, match="exceeds the bound"):  # the bound is applied
        check(backend, request, reply, bound=norm * 0.9999)


@pytest.mark.parametrize(("name", "phase", "options"), TRAINING, ids=_ids(TRAINING))
@pytest.mark.parametrize(
    ("kind", "tamper", "message"),
    [
        ("zero steps", lambda r: setattr(r, "steps", 0), "steps = 0, " + STEPS_OUT_OF_RANGE),
        ("more steps than asked", lambda r: setattr(r, "steps", ASKED + 1), STEPS_OUT_OF_RANGE),
        ("negative steps", lambda r: setattr(r, "steps", -1), "steps must be an integer ≥ 0"),
        ("steps as a bool", lambda r: setattr(r, "steps", True), "steps must be an integer"),
        (
            "inflated num_examples",
            lambda r: setattr(r, "num_examples", 10**9),
            "num_examples = 1000000000, but the site registered 10 training examples",
        ),
        ("shrunk num_examples", lambda r: setattr(r, "num_examples", 1), "registered 10"),
    ],
)
def test_a_hostile_count_is_rejected(name, phase, options, kind, tamper, message) -> None:
    backend, request, reply = honest(name, phase, **options)
    tamper(reply)
    with pytest.raises(InvalidReply, match=re.escape(message)) as info:
        check(backend, request, reply)
    assert "reply from site 'a'" in str(info.value)


@pytest.mark.parametrize(("name", "phase", "options"), COLLECT, ids=_ids(COLLECT))
def test_a_gradient_reply_claims_no_steps_and_the_registered_examples(name, phase, options):
    backend, request, reply = honest(name, phase, **options)
    assert reply.steps == 0
    reply.steps = 2
    with pytest.raises(InvalidReply, match="steps = 2, but phase 'collect' asks for no local"):
        check(backend, request, reply)
    reply.steps, reply.num_examples = 0, 11
    with pytest.raises(InvalidReply, match="num_examples = 11, but the site registered 10"):
        check(backend, request, reply)


@pytest.mark.parametrize(
    ("name", "phase", "options"), TRAINING + COLLECT, ids=_ids(TRAINING + COLLECT)
)
def test_an_absurd_update_is_rejected_for_every_kind_of_reply(name, phase, options) -> None:
    """Iterates, normalized directions and full gradients: ×1e6 of an honest reply is over a
    bound 10× the honest update norm."""
    backend, request, reply = honest(name, phase, **options)
    bound = 10 * backend.update_norm(reply, request)
    _scale_update(reply, request, 1e6)
    with pytest.raises(InvalidReply, match="exceeds the bound"):
        check(backend, request, reply, bound)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize(
    ("a_norm", "message"),
    [(1e12, "a_norm = 1e+12, but 3 local steps"), (1.0, "a_norm = 1, but 3"), (0.0, "a_norm")],
)
def test_fed_norm_sgda_a_norm_must_be_what_steps_and_momentum_give(momentum, a_norm, message):
    backend, request, reply = honest("fed_norm_sgda", momentum=momentum)
    assert reply.metrics["a_norm"] == pytest.approx(momentum_a_norm(ASKED, momentum))
    reply.metrics["a_norm"] = a_norm
    with pytest.raises(InvalidReply, match=re.escape(message)):
        check(backend, request, reply)
    del reply.metrics["a_norm"]
    with pytest.raises(InvalidReply, match="metric 'a_norm'"):
        check(backend, request, reply)


def test_fed_norm_sgda_update_norm_is_the_local_move_when_server_and_client_rates_agree():
    """With γ^s = η^c and τ_eff = the site's own ‖ā_i‖₁, the step line 18 takes for one reply
    is the site's local move, so iterate and gradient replies get the same bound."""
    backend = build_backend("fed_norm_sgda", lr=0.1, local_steps=ASKED, momentum=0.5)
    site = toy_sites(2)[0]
    state = backend.init_server(site, {"a": REGISTERED, "b": 20})
    request = backend.plan(state, 0)
    start = {n: t.clone() for n, t in site.tensors().items()}
    reply, _ = backend.client_update(request, {}, site, ToyStream())
    moved = math.sqrt(sum(float((site.tensors()[n] - t).pow(2).sum()) for n, t in start.items()))
    assert backend.update_norm(reply, request) == pytest.approx(moved, rel=1e-9)


def test_codasca_with_zero_steps_never_reaches_the_control_variate() -> None:
    """The issue's case: steps = 0 made Δc = (v − v_k)/(0 · η) ± inf in complete_reply."""
    backend, request, reply = honest("codasca")
    reply.steps = 0
    with pytest.raises(InvalidReply, match="steps = 0"):
        check(backend, request, reply)
    reply.steps = ASKED
    check(backend, request, reply)
    completed = backend.complete_reply(reply, request)
    assert all(bool(torch.isfinite(t).all()) for t in completed.tensors.values())


# -- compressed replies (--compress int8): the encoding itself is hostile ---------------------
def _scale_of(reply) -> str:
    return first_weight(reply) + SCALE


def negative_scale(reply):
    reply.tensors[_scale_of(reply)] = -reply.tensors[_scale_of(reply)] - 1


def nan_scale(reply):
    reply.tensors[_scale_of(reply)][0] = float("nan")


def huge_scale(reply):
    for name in [n for n in reply.tensors if n.endswith(SCALE)]:
        reply.tensors[name] = reply.tensors[name] * 1e9


def orphan_scale(reply):
    reply.tensors["w/evil" + SCALE] = torch.ones(1)


def uncompressed(reply):
    name = first_weight(reply)
    reply.tensors[name] = reply.tensors[name].float()


def rescaled_rows(reply):
    reply.tensors[_scale_of(reply)] = reply.tensors[_scale_of(reply)][:-1]


COMPRESSED_TAMPERINGS = {
    "negative scale": (negative_scale, "negative or non-finite scale"),
    "nan scale": (nan_scale, "negative or non-finite scale"),
    "huge scale": (huge_scale, "exceeds the bound"),
    "orphan scale": (orphan_scale, "scales no tensor"),
    "float32 in an int8 run": (uncompressed, "expected torch.int8 (int8)"),
    "wrong number of scales": (rescaled_rows, "float32 values"),
}


@pytest.fixture(scope="module")
def excluded_int8(tmp_path_factory) -> dict[str, torch.Tensor]:
    """As ``excluded``, with every request and reply compressed to int8."""
    return without_bad_site(tmp_path_factory, "excluded_int8", compress="int8")


@pytest.mark.parametrize("kind", list(COMPRESSED_TAMPERINGS))
def test_a_hostile_compressed_reply_is_rejected_and_never_averaged(
    tmp_path, monkeypatch, excluded_int8, kind
) -> None:
    tamper, message = COMPRESSED_TAMPERINGS[kind]

    def hostile(self, broadcast, original):
        reply = original(self, broadcast)
        assert reply.tensors[first_weight(reply)].dtype == torch.int8  # what travels
        tamper(reply)
        return reply

    summary = run(tmp_path, monkeypatch, hostile, compress="int8")
    with RunStore(tmp_path) as store:
        rows = store.site_rounds(summary["run_id"])
        assert set(rows[(rows["site"] == BAD) & (rows["round"] > 0)]["status"]) == {"rejected"}
        events = store.events(summary["run_id"])
        rejected = events[events["site"] == BAD]["message"]
        assert len(rejected) == 2 and rejected.str.contains(message, regex=False).all(), rejected
    model = load_torch(summary["model_path"])["state_dict"]
    for name, tensor in excluded_int8.items():
        assert torch.equal(model[name], tensor), name
