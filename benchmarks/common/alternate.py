"""A node's local step against a plain PyTorch loop, timed in alternation on one machine."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def alternate_rounds(
    node: Any, backend: Any, plain_steps: Callable[[int], None], pos_ratio: float,
    rounds: int, steps: int, batch: int,
) -> tuple[list[float], list[float], list[float | None]]:  # fmt: skip
    """Images/s of the node's rounds and of the plain loop's same number of steps, one after
    the other each round (so both see the same machine load), round 0 a warm-up for both;
    and each round's device peak memory as the node reported it."""
    state = backend.init_server(node.trainable, {node.name: len(node.site.train)})
    node_rates, plain_rates, peaks = [], [], []
    for round_ in range(rounds + 1):
        broadcast = backend.plan(state, round_)
        broadcast.config["pos_ratio"] = [pos_ratio]
        start = time.perf_counter()
        reply = node.train(broadcast)  # its meter synchronizes a CUDA device
        node_s = time.perf_counter() - start
        state = backend.aggregate(state, [backend.complete_reply(reply, broadcast)])
        start = time.perf_counter()
        plain_steps(steps)
        plain_s = time.perf_counter() - start
        if round_ > 0:
            node_rates.append(steps * batch / node_s)
            plain_rates.append(steps * batch / plain_s)
            peaks.append(reply.metrics.get("device_peak_mib"))
    return node_rates, plain_rates, peaks
