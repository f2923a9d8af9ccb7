"""A round's requests and replies as they travel under ``--compress``, read back by the
coordinator (``fed_auc.exchange.compression`` does the encoding).

The coordinator reads each reply against its request with the model exact and the rest as the
node decoded it: a reply's update is added to the exact model (the broadcast's rounding never
enters the server's state), and a backend that derives a site's state from its reply
(CODASCA's Δc^k from the control variates the node received) derives what the node itself
keeps (``Backend.reply_sent``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from fed_auc.algorithms.base import model_part
from fed_auc.coordinator.screening import InvalidReply, expected_tensors
from fed_auc.exchange import Broadcast, Reply, ReplyLayout
from fed_auc.exchange.compression import (
    COMPRESS_KEY,
    compress_broadcast,
    decompress_reply,
    received_broadcast,
)


def compressed_requests(
    broadcast: Broadcast, requests: Mapping[str, Broadcast], mode: str
) -> tuple[dict[str, Broadcast], dict[str, Broadcast]]:
    """(the requests as the coordinator reads their replies, as they travel): the same
    compressed tensors for every site of the phase."""
    if mode == "none":
        return dict(requests), dict(requests)
    wire = compress_broadcast(broadcast, mode)
    read = {**received_broadcast(wire).tensors, **model_part(broadcast.tensors)}
    reference = {site: dataclasses.replace(r, tensors=read) for site, r in requests.items()}
    sent = {
        site: dataclasses.replace(r, tensors=wire.tensors, config={**r.config, COMPRESS_KEY: mode})
        for site, r in requests.items()
    }
    return reference, sent


def decompressed(answer: Reply, request: Broadcast, layout: ReplyLayout, mode: str) -> Reply:
    """A compressed reply decoded against the exact model (``InvalidReply`` if malformed)."""
    expected = expected_tensors(model_part(request.tensors), layout)
    try:
        return decompress_reply(answer, mode, request, expected)
    except ValueError as exc:
        raise InvalidReply(str(exc)) from None
