"""A node that dies mid-upload must not hold the coordinator past the round's deadline.

Flower tells the ServerApp of a reply as soon as its head is at the SuperLink and then pulls
the reply's objects, retrying "not yet" for up to ``PULL_MAX_TIME`` (2 h) until the
SuperLink's object-push session expires (3 min). A node killed between the two left the
pull blocked that long: the round's deadline passed with the other sites' replies, already
at the SuperLink, never pulled, and the run failed for want of ``min_nodes`` answers (seen
in CI in ``test_flower_e2e``'s killed-node test under load).

No Flower process runs here. ``SuperLinkLike`` answers ``pull_messages`` the way Flower's
HTTP grid does: for each reply head it holds it pulls the objects with Flower's own
``pull_objects`` (under the ServerApp's backoff), and a reply whose objects cannot be pulled
becomes Flower's error reply from the ServerApp's own node.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from flwr.supercore.inflatable import inflatable_utils
from flwr.supercore.inflatable.inflatable_utils import ObjectPullError, ObjectUnavailableError
from flwr.supercore.task_identity import TaskIdentity

from fed_auc.exchange import NodeFailure
from fed_auc.experiment.files import FlowerSettings
from fed_auc.node.setup import NodeSetup
from fed_auc.transport.flower import backoff
from fed_auc.transport.flower import transport as flower_transport
from fed_auc.transport.flower.client import frame_content
from fed_auc.transport.flower.transport import FlowerTransport

SERVER_NODE = 0
HEALTHY, DEAD = 11, 22  # Flower node ids of the two sites


def _never_there(object_id: str) -> bytes:
    raise ObjectUnavailableError(object_id)


class SuperLinkLike:
    """The dead node's reply head is there from the first pull and its objects never come;
    the healthy node's reply arrives while the first pull is busy with them."""

    def __init__(self) -> None:
        self.pulls = 0
        self.message_of: dict[int, str] = {}

    def get_node_ids(self) -> list[int]:
        return [HEALTHY, DEAD]

    def push_messages(self, messages) -> list[str]:
        self.message_of = {m.metadata.dst_node_id: f"m{m.metadata.dst_node_id}" for m in messages}
        return list(self.message_of.values())

    def pull_messages(self, message_ids) -> list[SimpleNamespace]:
        self.pulls += 1
        replies = []
        if self.message_of[DEAD] in message_ids:
            try:
                inflatable_utils.pull_objects(object_ids=["obj"], pull_object_fn=_never_there)
            except ObjectPullError as exc:  # what Flower's HttpGrid answers in its place
                replies.append(self._reply(SERVER_NODE, DEAD, error=str(exc)))
        if self.message_of[HEALTHY] in message_ids and self.pulls > 1:
            replies.append(self._reply(HEALTHY, HEALTHY))
        return replies

    def _reply(self, src: int, to: int, error: str | None = None) -> SimpleNamespace:
        metadata = SimpleNamespace(src_node_id=src, reply_to_message_id=self.message_of[to])
        return SimpleNamespace(
            metadata=metadata,
            has_error=lambda: error is not None,
            error=SimpleNamespace(reason=error),
            content=frame_content({"cached": []}, []),
        )


def _transport(grid: SuperLinkLike) -> FlowerTransport:
    setup = NodeSetup("run", "codasca", {}, {}, "auc_margin", 8, 0.05, 0.0, "none", "none",
                      0, 16, 1)  # fmt: skip
    settings = FlowerSettings(expected_sites=2, min_nodes=1, insecure=True)
    transport = FlowerTransport(grid, setup, settings, log=lambda line: None)
    transport.node_of = {"healthy": HEALTHY, "dead": DEAD}
    return transport


def test_a_reply_whose_objects_never_arrive_is_dropped_by_the_deadline(monkeypatch):
    monkeypatch.setattr(flower_transport, "LAST_PULL_S", 0.5)
    monkeypatch.setattr(TaskIdentity, "_run_id", 7)  # what a ServerApp task has set
    monkeypatch.setattr(TaskIdentity, "_node_id", SERVER_NODE)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    for puller in backoff.PULLERS:  # shorten() edits Flower's defaults: restored afterwards
        monkeypatch.setattr(puller, "__kwdefaults__", dict(puller.__kwdefaults__))
    backoff.shorten()  # the ServerApp's pull backoff (20 ms … 0.25 s, Flower's 2 h patience)
    transport = _transport(SuperLinkLike())
    frames = {site: ({"kind": "train"}, []) for site in ("healthy", "dead")}
    answers: dict = {}
    raised: list[BaseException] = []

    def ask() -> None:
        try:
            answers.update(transport._ask(frames, "train", 1.0))
        except BaseException as exc:  # re-raised below, in the test's own thread
            raised.append(exc)

    started = time.monotonic()
    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    worker.join(timeout=30)  # before the fix: blocked in the first pull for Flower's 2 h
    assert not worker.is_alive(), "the pull outlived the round's deadline"
    if raised:
        raise raised[0]
    assert time.monotonic() - started < 1.0 + 0.5 + 2.0  # deadline + LAST_PULL_S + slack
    assert not isinstance(answers["healthy"], NodeFailure)  # at the SuperLink by the deadline
    assert answers["healthy"][0] == {"cached": []}
    dropped = answers["dead"]
    assert isinstance(dropped, NodeFailure) and dropped.status == "dropped"
    assert "dead" in transport.away_since and "healthy" not in transport.away_since


def test_the_pull_time_limit_is_flowers_again_after_the_block():
    before = inflatable_utils.pull_objects.__kwdefaults__["max_time"]
    with backoff.time_limit(0.1):
        assert inflatable_utils.pull_objects.__kwdefaults__["max_time"] == 0.1
    assert inflatable_utils.pull_objects.__kwdefaults__["max_time"] == before
