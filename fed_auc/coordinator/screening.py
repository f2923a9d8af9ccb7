"""Checks on every node reply before it can touch the global model.

A backend declares, per phase, the layout of a reply (``Backend.reply_layout``): for each
prefix, one tensor per variable of the model (``""`` = the iterates themselves, ``"dc/"`` =
CODASCA's control-variate change, ``"g/"`` = a gradient...), plus the BatchNorm buffers or not.
A reply must carry exactly those tensors, each with the shape and dtype of the model tensor it
refers to and finite values, and counts that match the request: 1 ≤ steps ≤ the local steps
asked for, num_examples = what the site registered. A backend checks the scalars it uses
(``Backend.check_reply``, e.g. Fed-Norm-SGDA's ‖ā_i‖₁) and says how far a reply would move the
model (``Backend.update_norm``), which ``--max-update-norm`` bounds for every kind of reply:
iterates, gradients and normalized directions alike.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import torch

from fed_auc.algorithms.base import Backend, iterate_distance, model_part
from fed_auc.algorithms.partial import trained_part
from fed_auc.exchange import Broadcast, Reply, ReplyLayout, payload_bytes
from fed_auc.exchange.compression import COMPRESS_KEY
from fed_auc.privacy.secure.encoding import MASKED, words_for
from fed_auc.trainable import BUFFER, Tensors


class InvalidReply(ValueError):
    """A reply that must not be aggregated; the message names the tensor and the problem."""


def expected_tensors(model: Tensors, layout: ReplyLayout) -> dict[str, torch.Tensor]:
    """Name → reference model tensor, for every tensor the layout asks for."""
    variables = [n for n in model if not n.startswith(BUFFER)]
    expected = {prefix + n: model[n] for prefix in layout.prefixes for n in variables}
    if layout.buffers:
        expected.update({n: t for n, t in model.items() if n.startswith(BUFFER)})
    return expected


def validate_answer(
    reply: object,
    site: str,
    request: Broadcast,
    layout: ReplyLayout,
    max_update_norm: float | None = None,
    personal: Collection[str] = (),
    backend: Backend | None = None,
    registered_examples: int | None = None,
    masked_length: int | None = None,
) -> None:
    """Everything the coordinator checks before a node's answer may be aggregated.

    Under secure aggregation (``masked_length``: the masked vector's length) the values are
    masked: only the envelope, the vector's form and the counts can be checked.

    The envelope first (it is a reply, from the site that was asked, to this round and phase,
    no bigger than the layout allows), then the tensors (``validate_reply``), then its counts
    against the request (``validate_counts``), then the backend's own scalars
    (``Backend.check_reply``), then the size of the update the server would apply for it
    (``Backend.update_norm``; without a backend, ‖v_k − v‖ of the iterates) against the bound.
    """
    if not isinstance(reply, Reply):
        raise InvalidReply(f"answer of site {site!r} is a {type(reply).__name__}, not a Reply")
    if reply.site != site:
        raise InvalidReply(f"answer to site {site!r} claims to come from site {reply.site!r}")
    if (reply.round, reply.phase) != (request.round, request.phase):
        raise InvalidReply(
            f"reply from site {site!r} answers round {reply.round!r} phase {reply.phase!r}, "
            f"but round {request.round} phase {request.phase!r} was asked"
        )
    model = model_part(request.tensors)
    if masked_length is None:
        limit = payload_size(expected_tensors(model, layout))
    else:
        limit = 8 * masked_length
    size = payload_size(reply.tensors)
    if size is None or size > limit:
        raise InvalidReply(
            f"reply from site {site!r}: oversized or malformed payload ({size} bytes; "
            f"this phase's layout is {limit} bytes)"
        )
    if masked_length is None:
        validate_reply(reply, model, layout, personal)
    else:
        words = words_for(request.config.get(COMPRESS_KEY, "none"))
        validate_masked(reply, model, masked_length, words.torch_dtype)
    validate_counts(reply, request, registered_examples)
    if backend is not None:
        try:
            backend.check_reply(reply, request)
        except ValueError as exc:
            raise InvalidReply(f"reply from site {site!r}: {exc}") from None
    if max_update_norm is not None and masked_length is None:
        if backend is not None:
            norm = backend.update_norm(reply, request)
        else:
            norm = iterate_distance(model, reply.tensors)
        if norm is not None and not norm <= max_update_norm:  # NaN fails too
            raise InvalidReply(
                f"reply from site {site!r}: the update it makes the server apply has norm "
                f"{norm:.4g}, which exceeds the bound {max_update_norm:.4g} (--max-update-norm)"
            )


def validate_counts(
    reply: Reply, request: Broadcast, registered_examples: int | None = None
) -> None:
    """The reply's counts against what was asked: 1 ≤ steps ≤ the local steps the request
    asked of this site (0 in a phase that asks for none, such as FedSGDA's gradient
    collection), and num_examples = the training examples the site registered."""
    where = f"reply from site {reply.site!r}"
    steps = reply.steps
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise InvalidReply(f"{where}: steps must be an integer, got {steps!r}")
    asked = request.config.get("local_steps")
    if asked is None:
        if steps != 0:
            raise InvalidReply(
                f"{where}: steps = {steps}, but phase {request.phase!r} asks for no local steps"
            )
    elif not 1 <= steps <= asked:
        raise InvalidReply(
            f"{where}: steps = {steps}, outside 1 ≤ steps ≤ {asked} (the local steps asked for)"
        )
    examples = reply.num_examples
    if registered_examples is not None and examples != registered_examples:
        raise InvalidReply(
            f"{where}: num_examples = {examples!r}, but the site registered "
            f"{registered_examples} training examples"
        )


def payload_size(tensors: object) -> int | None:
    """Bytes of tensor data, or None if the payload is not a dict of tensors."""
    if not isinstance(tensors, dict) or not all(
        isinstance(t, torch.Tensor) for t in tensors.values()
    ):
        return None
    return payload_bytes(tensors)


def validate_reply(
    reply: Reply,
    model: Tensors,
    layout: ReplyLayout | None = None,
    personal: Collection[str] = (),
) -> None:
    """Raise ``InvalidReply`` naming the first problem found.

    ``personal``: model tensors that stay on the nodes (personalization) and must not be
    sent; a partial-training reply is checked against the suffix it declares it trained.
    """
    where = f"reply from site {reply.site!r}"
    layout = layout or ReplyLayout()
    if reply.trained_groups is not None:  # a suffix of the whole model's layer groups
        try:
            model = trained_part(model, reply.trained_groups)
        except ValueError as exc:
            raise InvalidReply(f"{where}: {exc}") from None
    model = {n: t for n, t in model.items() if n not in personal}
    _check_counts(where, reply)
    expected = expected_tensors(model, layout)
    missing = sorted(set(expected) - set(reply.tensors))
    if missing:
        more = " …" if len(missing) > 3 else ""
        raise InvalidReply(f"{where}: missing tensor(s) {missing[:3]}{more}")
    unexpected = sorted(set(reply.tensors) - set(expected))
    if unexpected:
        raise InvalidReply(f"{where}: unexpected tensor {unexpected[0]!r}")
    for name, tensor in reply.tensors.items():
        _check_tensor(where, name, tensor, expected[name])
    _check_finite(where, reply.tensors)


def validate_masked(
    reply: Reply, model: Tensors, length: int, dtype: torch.dtype = torch.int64
) -> None:
    """A masked reply: its counts, metrics and trained groups, and exactly one vector of
    ``length`` words of ``dtype`` (int64; int32 under ``--compress fp16``: ``words_for``)
    (``fed_auc.privacy.secure``); its values are uniform noise here."""
    where = f"reply from site {reply.site!r}"
    if reply.trained_groups is not None:
        try:
            trained_part(model, reply.trained_groups)
        except ValueError as exc:
            raise InvalidReply(f"{where}: {exc}") from None
    _check_counts(where, reply)
    if set(reply.tensors) != {MASKED}:
        raise InvalidReply(
            f"{where}: under secure aggregation a reply carries only {MASKED!r}, got "
            f"{sorted(reply.tensors)[:3]}"
        )
    _check_tensor(where, MASKED, reply.tensors[MASKED], torch.zeros(length, dtype=dtype))


def _check_counts(where: str, reply: Reply) -> None:
    if not isinstance(reply.num_examples, int) or reply.num_examples < 1:
        raise InvalidReply(
            f"{where}: num_examples must be a positive integer, got {reply.num_examples!r}"
        )
    if not isinstance(reply.steps, int) or reply.steps < 0:
        raise InvalidReply(f"{where}: steps must be an integer ≥ 0, got {reply.steps!r}")
    for key, value in reply.metrics.items():
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise InvalidReply(f"{where}: metric {key!r} is {value!r}")


def _check_finite(where: str, tensors: Tensors) -> None:
    """No NaN or infinity anywhere: 0 · t is 0 where t is finite and NaN elsewhere, so one
    fused pass over all tensors (not one check per tensor) finds any bad value."""
    names = [n for n, t in tensors.items() if t.is_floating_point() and t.numel()]
    if not names:
        return
    zeros = torch._foreach_mul([tensors[n] for n in names], 0.0)
    bad = torch.nonzero(~torch.isfinite(torch.stack(torch._foreach_norm(zeros)))).flatten()
    if len(bad):
        raise InvalidReply(f"{where}: {names[int(bad[0])]!r} contains NaN or infinite values")


def _check_tensor(where: str, name: str, tensor: object, reference: torch.Tensor) -> None:
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
