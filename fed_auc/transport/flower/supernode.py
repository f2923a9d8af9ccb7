"""``flower-supernode`` with a short idle poll: ``python -m fed_auc.transport.flower.supernode``.

Flower 1.42's SuperNode sleeps 3 s whenever the SuperLink has no message for it, and 0.5 s
between checks for its ClientApp's reply and, while forwarding that reply, for each of its
objects (every 5 MiB chunk) not yet pushed by the ClientApp (all hard-coded in
``flwr.supernode.start_client_internal``). A round sends each node a training and an
evaluation message, each usually arriving while the node sleeps: up to 6 s per round of
waiting for nothing; and a reply forwarded chunk by chunk as the node's executor pushes it
waited up to 0.5 s per chunk. This entry point caps the idle sleep at ``POLL_S`` (each try is
an HTTP request to the SuperLink) and the others, checks of the SuperNode's own memory, at
``LOCAL_POLL_S``; it shortens the waits between object pulls (``flower.backoff``) and is
otherwise Flower's own ``flower-supernode``, with the same arguments. Written against the
pinned Flower (tests/unit/transport/test_flower_pin.py).
"""

from __future__ import annotations

import time
from typing import Any

from flwr.supernode import start_client_internal
from flwr.supernode.cli.flower_supernode import flower_supernode

from fed_auc.transport.flower import backoff

POLL_S = 0.1  # a pull every 0.1 s when idle: a small HTTP request, cheap for the SuperLink
LOCAL_POLL_S = 0.005  # a look into this process's own state: the reply, a chunk of it
IDLE_SLEEP_S = 3  # Flower's sleep after an empty pull from the SuperLink


class _ShortSleeps:
    """The ``time`` module as the SuperNode's loop sees it, with sleeps capped."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(min(seconds, POLL_S if seconds >= IDLE_SLEEP_S else LOCAL_POLL_S))


start_client_internal.time = _ShortSleeps()  # type: ignore[assignment]
backoff.shorten()  # and its pulls from the SuperLink retry within tenths of a second

if __name__ == "__main__":
    flower_supernode()
