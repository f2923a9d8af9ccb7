"""Fewer bytes on the wire: a round's tensors as fp16 or int8 (``--compress``).

What is compressed, and from what:

- **Uploads** carry the update Δ = reply − the broadcast the node received, per tensor the
  broadcast also holds (the iterates, the BatchNorm statistics), and other tensors (gradients,
  directions) as they are. The coordinator adds Δ̂ to the broadcast it holds exactly, so the
  rounding of what it sent never enters its model, and a small update is never lost to the
  rounding of a large weight.
- **Broadcasts** carry the values (the nodes hold nothing to take a difference from). The
  coordinator keeps its own state in fp32; evaluation requests are never compressed (an AUC a
  clinician reads is the model's, not its rounding's).

Encodings, per floating-point tensor (integer tensors, e.g. BatchNorm's step counter, travel
as they are):

- ``fp16``: the value cast to float16, round to nearest: relative error ≤ 2^-11, 2× fewer bytes.
- ``int8``: q = ⌊x / s + u⌋ with u ~ U[0, 1) (stochastic rounding), s = max|x| / 127 per row
  of the tensor's first dimension (per tensor for scalars and vectors), sent as int8 q plus
  the float32 row scales ``NAME#scale``: E[s·q] = x, so the coordinator's mean of the sites'
  updates stays unbiased without any state on the node (error feedback would need a residual
  kept across rounds, resumed after a crash and kept apart per phase, and is biased in any one
  round). The draws come from a generator seeded by who sends what (site, round, phase), so
  a reply computed again (a resumed node) is the same bytes.

Compression comes after a node's privacy mechanism (clipping and noise), so ε is unchanged
(post-processing); the node's own state follows what its coordinator will decode
(``Backend.reply_sent``). ``decode`` refuses a malformed compressed tensor by name (a scale
that is not finite or negative, a shape that does not match), as screening refuses any reply.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping

import torch

from fed_auc.exchange import Broadcast, Reply, Tensors

MODES = ("none", "fp16", "int8")
COMPRESS_KEY = "compress"  # a train request's config: how it travels, and how its reply does
SCALE = "#scale"  # suffix of an int8 tensor's row scales
LEVELS = 127  # int8 values used: -127..127, symmetric


def check_mode(mode: object, where: str = "compress") -> str:
    """``mode`` if it is one of ``MODES``; ``ValueError`` naming ``where`` otherwise."""
    if mode not in MODES:
        raise ValueError(f"{where} = {mode!r}: must be one of {list(MODES)}")
    return mode


def seed_for(*parts: object) -> int:
    """A 63-bit seed from ``parts`` (e.g. site, round, phase): the same draws for the same
    message, in any process."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") >> 1


def generator_for(*parts: object) -> torch.Generator:
    """A torch generator seeded by ``seed_for(*parts)``."""
    return torch.Generator().manual_seed(seed_for(*parts))


def compressed(tensor: torch.Tensor) -> bool:
    """Whether ``encode`` changes ``tensor`` (floating point, fp32 or wider)."""
    return tensor.is_floating_point() and tensor.element_size() >= 4


def encode(
    tensors: Tensors,
    mode: str,
    base: Mapping[str, torch.Tensor] | None = None,
    generator: torch.Generator | None = None,
) -> Tensors:
    """``tensors`` as they travel under ``mode``; a tensor of the same name and shape in
    ``base`` is sent as the difference from it."""
    check_mode(mode)
    if mode == "none":
        return dict(tensors)
    out: Tensors = {}
    for name, tensor in tensors.items():
        if not compressed(tensor):
            out[name] = tensor
            continue
        value = tensor.detach().float()
        reference = None if base is None else base.get(name)
        if reference is not None and reference.shape == tensor.shape:
            value = value - reference.detach().float()
        if mode == "fp16":
            out[name] = value.half()
        else:
            out[name], out[name + SCALE] = _int8(value, generator)
    return out


def _int8(value: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, ...]:
    """Stochastically rounded int8 values and float32 scales, one per row (dimension 0)."""
    count = value.shape[0] if value.dim() >= 2 else 1
    if value.numel() == 0:  # an empty tensor: no values, scales of 0
        return torch.zeros(value.shape, dtype=torch.int8), torch.zeros(count)
    rows = value.reshape(count, -1)
    scale = rows.abs().amax(dim=1) / LEVELS
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    noise = torch.rand(rows.shape, generator=generator)
    q = torch.floor(rows / safe[:, None] + noise).clamp_(-LEVELS, LEVELS)
    return q.to(torch.int8).reshape(value.shape), scale


def decode(
    tensors: Mapping[str, torch.Tensor],
    mode: str,
    reference: Mapping[str, torch.Tensor] | None = None,
    base: Mapping[str, torch.Tensor] | None = None,
    where: str = "message",
) -> Tensors:
    """Inverse of ``encode``: fp32 tensors (``base`` added back where the difference was
    sent). ``reference``: the tensors the message may carry, by name (their shapes and
    dtypes; an unknown name is left for the caller's own checks); None: every tensor in the
    mode's dtype is decoded. ``ValueError`` names the tensor of a malformed encoding."""
    check_mode(mode)
    if mode == "none":
        return dict(tensors)
    wanted = torch.float16 if mode == "fp16" else torch.int8
    out: Tensors = {}
    for name, tensor in tensors.items():
        if name.endswith(SCALE):
            if name.removesuffix(SCALE) not in tensors or mode != "int8":
                raise ValueError(f"{where}: {name!r} scales no tensor")
            continue
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{where}: {name!r} is a {type(tensor).__name__}, not a tensor")
        known = None if reference is None else reference.get(name)
        if reference is None and tensor.dtype != wanted:
            out[name] = tensor
            continue
        if reference is not None and (known is None or not compressed(known)):
            out[name] = tensor
            continue
        if known is not None and tuple(tensor.shape) != tuple(known.shape):
            raise ValueError(
                f"{where}: {name!r} has shape {tuple(tensor.shape)}, expected {tuple(known.shape)}"
            )
        value = _decoded(name, tensor, tensors.get(name + SCALE), mode, wanted, where)
        origin = None if base is None else base.get(name)
        if origin is not None and origin.shape == tensor.shape:
            value = value + origin.float()
        out[name] = value if known is None else value.to(known.dtype)
    return out


def _decoded(
    name: str, tensor: torch.Tensor, scale: object, mode: str, wanted: torch.dtype, where: str
) -> torch.Tensor:
    if tensor.dtype != wanted:
        raise ValueError(f"{where}: {name!r} is {tensor.dtype}, expected {wanted} ({mode})")
    if mode == "fp16":
        return tensor.float()
    rows = tensor.shape[0] if tensor.dim() >= 2 else 1
    if not isinstance(scale, torch.Tensor) or tuple(scale.shape) != (rows,):
        raise ValueError(f"{where}: {name!r} needs {name + SCALE!r} of {rows} float32 values")
    scale = scale.float()
    largest = float(scale.max()) if rows else 0.0
    if not math.isfinite(largest) or bool((scale < 0).any()):
        raise ValueError(f"{where}: {name + SCALE!r} holds a negative or non-finite scale")
    if tensor.numel() == 0:
        return tensor.float()
    flat = tensor.reshape(rows, -1).float() * scale[:, None]
    return flat.reshape(tensor.shape)


# -- messages -------------------------------------------------------------------------------
def compress_broadcast(broadcast: Broadcast, mode: str) -> Broadcast:
    """The broadcast as it travels; its config tells the node how to read it and how to send
    its reply (``COMPRESS_KEY``). The same bytes for every site of a round and phase."""
    check_mode(mode)
    generator = generator_for("broadcast", broadcast.round, broadcast.phase)
    tensors = encode(broadcast.tensors, mode, generator=generator)
    return dataclasses.replace(
        broadcast, tensors=tensors, config={**broadcast.config, COMPRESS_KEY: mode}
    )


def received_broadcast(broadcast: Broadcast) -> Broadcast:
    """What a node trains from: the broadcast decoded as its config says (``ValueError``
    naming a malformed tensor)."""
    mode = check_mode(broadcast.config.get(COMPRESS_KEY, "none"), f"request's {COMPRESS_KEY}")
    if mode == "none":
        return broadcast
    where = f"round {broadcast.round + 1} {broadcast.phase} request"
    return dataclasses.replace(broadcast, tensors=decode(broadcast.tensors, mode, where=where))


def compress_reply(reply: Reply, broadcast: Broadcast) -> tuple[Reply, Reply]:
    """(what leaves the node, what its coordinator will decode from it, as the node can
    know it: the update added to the broadcast the node received)."""
    mode = check_mode(broadcast.config.get(COMPRESS_KEY, "none"), f"request's {COMPRESS_KEY}")
    if mode == "none":
        return reply, reply
    generator = generator_for("reply", reply.site, broadcast.round, broadcast.phase)
    wire = encode(reply.tensors, mode, broadcast.tensors, generator)
    seen = decode(wire, mode, reply.tensors, broadcast.tensors, f"site {reply.site!r}")
    return dataclasses.replace(reply, tensors=wire), dataclasses.replace(reply, tensors=seen)


def decompress_reply(
    reply: Reply, mode: str, request: Broadcast, expected: Mapping[str, torch.Tensor]
) -> Reply:
    """A node's reply as the coordinator aggregates it: the updates added to the broadcast
    it holds exactly (``request``); ``expected``: the tensors a valid reply carries."""
    if mode == "none" or not isinstance(reply, Reply) or not isinstance(reply.tensors, dict):
        return reply
    where = f"reply from site {reply.site!r}"
    tensors = decode(reply.tensors, mode, expected, request.tensors, where)
    return dataclasses.replace(reply, tensors=tensors)
