"""Short waits between Flower's object pulls, for every fed-auc process that pulls.

A Flower message travels as a small head plus objects (its arrays, in 5 MiB chunks), and
the receiver is told of the message before the sender has finished pushing its objects:
the SuperNode pulls from the SuperLink while the ServerApp is still pushing, the node's
ClientApp task pulls from the SuperNode while the SuperNode is still pulling, and the
ServerApp pulls a reply while the node is still pushing it. Flower 1.42 answers "not yet"
with a wait of 1 s, then 2, 4, … up to 10 s (``flwr.supercore.constant.PULL_*``), though
the objects are there a few tenths of a second later: on a DenseNet121 round (3 sites,
benchmarks/systems/flower_overhead.py) shorter waits took the transport overhead from 9.7 to ~6 s.
Here the first wait is ``INITIAL_S`` and they grow to ``CAP_S``, with as many tries as keep
Flower's own patience (``PULL_MAX_TIME``) for a slow link. The ServerApp, the SuperNode and
the node's task executor each call ``shorten()`` (the executor, pulling from its own
SuperNode, with ``LOCAL_CAP_S``).

Flower's patience is also a hazard for the ServerApp: a node that dies after pushing a
reply's head but before its objects leaves that reply unpullable until the SuperLink's
object-push session expires (``OBJECT_PUSH_SESSION_TTL_SECONDS``, 3 min), and the pull
blocks that long, past the round's deadline, while other sites' replies wait unpulled.
``time_limit`` caps one pull at the time the round has left.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from flwr.supercore import constant
from flwr.supercore.inflatable import inflatable_utils

INITIAL_S = 0.02  # a "not yet" on loopback or a LAN is usually over within milliseconds
CAP_S = 0.25  # worst case a quarter second late; one small HTTP request per try
# A node's executor pulls from its own SuperNode on 127.0.0.1 while that SuperNode is still
# pulling the message from the SuperLink, chunk by chunk: a try there is cheap, and each
# chunk is picked up within 50 ms of its arrival instead of up to 250 ms.
LOCAL_CAP_S = 0.05

# Flower's two pull functions; their keyword defaults carry the backoff.
PULLERS = (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree)


def shorten(cap: float = CAP_S) -> None:
    """Set the pull backoff of this process's Flower to ``INITIAL_S`` … ``cap``."""
    tries = int(constant.PULL_MAX_TIME / cap) + 1  # Flower's time budget, in shorter waits
    for puller in PULLERS:
        puller.__kwdefaults__.update(
            initial_backoff=min(INITIAL_S, cap), backoff_cap=cap, max_tries_per_object=tries
        )


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Within the block, a reply whose objects are not all pulled in ``seconds`` becomes
    Flower's "unavailable" error reply instead of blocking the pull (ServerApp only)."""
    defaults = inflatable_utils.pull_objects.__kwdefaults__
    before = defaults["max_time"]
    defaults["max_time"] = seconds
    try:
        yield
    finally:
        defaults["max_time"] = before
