"""Checks on every node reply before it can touch the global model.

A reply must carry every tensor of the global model, and may carry backend extras named
``<prefix>/<model tensor name>`` (CODASCA's ``dc/…``, CODA+'s ``mean/…``), each with the
shape and dtype of the model tensor it refers to. Values must be finite, counts sensible,
and the payload no larger than the backend could have produced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fed_auc.algorithms.base import Reply, model_part
from fed_auc.trainable import BUFFER, Tensors


class InvalidReply(ValueError):
    """A reply that must not be aggregated; the message names the tensor and the problem."""


def validate_reply(
    reply: Reply,
    model: Tensors,
    required_extras: Sequence[str] = (),
    max_tensors_factor: int = 3,
) -> None:
    """Raise ``InvalidReply`` naming the first problem found."""
    where = f"reply from site {reply.site!r}"
    if not isinstance(reply.num_examples, int) or reply.num_examples < 1:
        raise InvalidReply(
            f"{where}: num_examples must be a positive integer, got {reply.num_examples!r}"
        )
    if not isinstance(reply.steps, int) or reply.steps < 0:
        raise InvalidReply(f"{where}: steps must be an integer ≥ 0, got {reply.steps!r}")
    for key, value in reply.metrics.items():
        if not math.isfinite(float(value)):
            raise InvalidReply(f"{where}: metric {key!r} is {value!r}")
    if len(reply.tensors) > max_tensors_factor * len(model):
        raise InvalidReply(
            f"{where}: {len(reply.tensors)} tensors, more than "
            f"{max_tensors_factor}× the model's {len(model)}"
        )
    missing = sorted(set(model) - set(model_part(reply.tensors)))
    if missing:
        raise InvalidReply(
            f"{where}: missing model tensor(s) {missing[:3]}{' …' if len(missing) > 3 else ''}"
        )
    for prefix in required_extras:
        absent = [n for n in model if not n.startswith(BUFFER) and prefix + n not in reply.tensors]
        if absent:
            raise InvalidReply(f"{where}: missing {prefix}{absent[0]}")
    for name, tensor in reply.tensors.items():
        _check_tensor(where, name, tensor, model)


def _check_tensor(where: str, name: str, tensor: object, model: Tensors) -> None:
    reference = model.get(name)
    if reference is None and "/" in name:
        reference = model.get(name.split("/", 1)[1])
    if reference is None:
        raise InvalidReply(f"{where}: unexpected tensor {name!r}")
    if not isinstance(tensor, torch.Tensor):
        raise InvalidReply(f"{where}: {name!r} is a {type(tensor).__name__}, not a tensor")
    if tensor.shape != reference.shape:
        raise InvalidReply(
            f"{where}: {name!r} has shape {tuple(tensor.shape)}, expected {tuple(reference.shape)}"
        )
    if tensor.dtype != reference.dtype:
        raise InvalidReply(
            f"{where}: {name!r} has dtype {tensor.dtype}, expected {reference.dtype}"
        )
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        raise InvalidReply(f"{where}: {name!r} contains NaN or infinite values")
