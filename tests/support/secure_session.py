"""Driving secure aggregation's first steps in-process, as the coordinator does."""

from __future__ import annotations


def advertise(server, nodes) -> None:
    """Advertise keys and reveal graph nonces: the server then holds the session's graph."""
    server.collect_keys({s: nodes[s].handle("advertise", m)
                         for s, m in server.advertise_requests().items()})  # fmt: skip
    server.collect_reveals({s: nodes[s].handle("reveal", m)
                            for s, m in server.reveal_requests().items()})  # fmt: skip
