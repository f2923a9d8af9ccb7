"""Property-based checks: any config or reply is either valid or refused with a clear error."""

from __future__ import annotations

import dataclasses
import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fed_auc.coordinator.screening import InvalidReply, validate_answer
from fed_auc.exchange import Broadcast, Reply, ReplyLayout
from fed_auc.experiment.config import ExperimentConfig

DATA_DEFAULTS = (
    "loss", "select", "min_neg_fraction", "augment", "warmup_head", "lr", "model", "warmup_rounds"
)
FIELDS = [f.name for f in dataclasses.fields(ExperimentConfig) if f.name != "runs_dir"]
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10_000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(-2, 30), max_size=7),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,  # the same examples on every run: a CI failure reproduces
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.dictionaries(st.sampled_from(FIELDS + ["colour", "round"]), VALUES, max_size=3))
def test_any_config_is_valid_or_refused_naming_the_option(values) -> None:
    try:
        config = ExperimentConfig(**values)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        by_backend = "backend_options" in values and "hyperparameter" in message
        assert by_backend or any(name in message for name in values), (values, message)
        return
    for name, value in values.items():  # accepted: the value is kept as given, and finite
        if name not in DATA_DEFAULTS or value is not None:  # None: the data's default
            assert getattr(config, name) == value
        assert not isinstance(value, float) or math.isfinite(value), (name, value)


MODEL = {"w/x": torch.zeros(2, 3), "auc/a": torch.zeros(1), "buf/m": torch.zeros(3)}
REQUEST = Broadcast(round=4, phase="train", tensors=MODEL, config={"local_steps": 4})
REGISTERED = 10  # the training examples site "a" registered
SHAPES = st.sampled_from([(2, 3), (3, 2), (6,), (1,), (3,), ()])
DTYPES = st.sampled_from([torch.float32, torch.float64, torch.float16, torch.int64])
TENSORS = st.builds(
    lambda shape, dtype, fill: torch.full(shape, fill).to(dtype),
    SHAPES,
    DTYPES,
    st.floats(allow_nan=True, allow_infinity=True, width=32),
)
PAYLOADS = st.dictionaries(st.sampled_from(["w/x", "auc/a", "buf/m", "w/evil", "dc/w/x"]), TENSORS)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    PAYLOADS,
    st.sampled_from(["a", "b"]),
    st.integers(2, 6),
    st.one_of(st.just(REGISTERED), st.integers(-3, 50), st.floats(), st.none()),
    st.one_of(st.integers(-2, 10), st.booleans(), st.text(max_size=2)),
)
def test_any_reply_is_accepted_only_if_exactly_right(
    payload, site, round_, examples, steps
) -> None:
    reply = Reply(payload, steps=steps, num_examples=examples, site=site, round=round_)
    reply.phase = "train"
    right = (
        set(payload) == set(MODEL)
        and all(
            t.shape == MODEL[n].shape and t.dtype == torch.float32 and bool(torch.isfinite(t).all())
            for n, t in payload.items()
        )
        and site == "a"
        and round_ == 4
        and type(examples) is int
        and examples == REGISTERED
        and isinstance(steps, int)
        and not isinstance(steps, bool)
        and 1 <= steps <= REQUEST.config["local_steps"]  # what was asked, at most
    )
    try:
        validate_answer(
            reply, "a", REQUEST, ReplyLayout(), max_update_norm=1e30, registered_examples=10
        )
    except InvalidReply as exc:
        assert not right, str(exc)
        assert "site 'a'" in str(exc)
        return
    assert right
