"""What every transport returns and counts."""

from __future__ import annotations

from dataclasses import dataclass

from fed_auc.trainable import Tensors


@dataclass(frozen=True)
class NodeFailure:
    """A node that did not answer usefully: ``dropped`` (no answer in time) or ``error``."""

    site: str
    status: str
    message: str


def payload_bytes(tensors: Tensors) -> int:
    """Bytes of tensor data in a payload: what crosses the wire, before any framing."""
    return sum(t.numel() * t.element_size() for t in tensors.values())
