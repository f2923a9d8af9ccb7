"""How requests reach nodes: in-process (``local``) now; Flower in deployment."""

from fed_auc.transport.base import NodeFailure, payload_bytes
from fed_auc.transport.local import LocalTransport

__all__ = ["LocalTransport", "NodeFailure", "payload_bytes"]
