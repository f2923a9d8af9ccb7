"""The protocol's messages as JSON-able dicts, so any transport can carry them.

Steps of one session (one phase of one round), after Bonawitz et al. (CCS 2017) and Bell et
al.'s SecAgg+ (CCS 2020), as Flower's ``secaggplus`` workflow names them: ``advertise`` (each
site's two fresh public keys and a commitment to a graph nonce; the weights) → ``reveal``
(once every commitment is out, each site's nonce: the graph seed is a hash of them all) →
``share`` (each site's Shamir shares of its self-mask seed and mask key, encrypted to each of
its neighbours) → ``mask`` (carried by the train request: the site trains, then sends its
masked vector) → ``unmask`` (each survivor sends the shares it holds that the server needs:
self-mask seeds of its neighbours whose vectors arrived, mask keys of those that dropped after
sharing, never both of one site).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

CONFIG_KEY = "secure_aggregation"  # the train request's config entry


class SecureAggregationError(RuntimeError):
    """The session cannot complete (too few sites, a message out of order or malformed)."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: Any, what: str) -> bytes:
    if not isinstance(text, str):
        raise SecureAggregationError(f"{what} must be a base64 string, got {type(text).__name__}")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except ValueError:
        raise SecureAggregationError(f"{what} is not valid base64") from None


def require(message: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    """``message[key]``, checked to be a ``kind``; a clear error otherwise."""
    if not isinstance(message, Mapping):
        raise SecureAggregationError(f"{where}: message is a {type(message).__name__}, not a dict")
    if key not in message:
        raise SecureAggregationError(f"{where}: field {key!r} is missing")
    value = message[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise SecureAggregationError(
            f"{where}: field {key!r} must be a {kind.__name__}, got {type(value).__name__}"
        )
    return value


def associated(session: str, source: str, destination: str, context: bytes) -> bytes:
    """What an encrypted share is bound to: its session, its pair of sites and the digest of
    everything the pair was told of the session (``checks.context_digest``)."""
    return f"{session}\x00{source}\x00{destination}\x00".encode() + context


def pack_shares(seed_share: bytes, key_share: bytes) -> bytes:
    return len(seed_share).to_bytes(4, "little") + seed_share + key_share


def unpack_shares(data: bytes) -> tuple[bytes, bytes]:
    size = int.from_bytes(data[:4], "little")
    return data[4 : 4 + size], data[4 + size :]
