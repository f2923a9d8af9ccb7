"""The coordinator's side of Flower messaging: ``FlowerTransport`` and its ``[flower]`` settings.

``FlowerTransport`` is the Flower twin of ``LocalTransport`` (register, train, evaluate), with
deadlines: a site that does not answer in time is a ``dropped`` NodeFailure, a Flower error
reply an ``error`` one, and the round goes on with the rest as long as at least ``min_nodes``
answered. The round loop itself is ``fed_auc.coordinator.loop.Coordinator``, unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from flwr.app import Message
from flwr.serverapp import Grid

from fed_auc.coordinator.errors import FederationError
from fed_auc.exchange import Broadcast, Evaluation, NodeFailure, Reply, refused_status
from fed_auc.experiment.files import FlowerSettings
from fed_auc.node.setup import NodeSetup
from fed_auc.trainable import Tensors
from fed_auc.transport.flower import backoff
from fed_auc.transport.flower.client import frame_content, message_frame
from fed_auc.transport.flower.codec import (
    Frame,
    broadcast_frame,
    frame_evaluation,
    frame_reply,
    pair_tensors,
    tensor_frame,
)
from fed_auc.transport.flower.identity import SiteIdentities

# How often the ServerApp asks the SuperLink for replies. Flower's ``send_and_receive``
# sleeps 3 s between pulls, which adds up to seconds per request on a tiny model.
PULL_INTERVAL_S = 0.05
# How long the nodes get to acknowledge the end of a run (a small message, answered at once).
END_TIMEOUT_S = 10.0
# The longest a pull may take once the deadline has come: enough to fetch a reply that was
# complete at the SuperLink by then (a DenseNet121 reply is ~28 MB of float32 weights).
LAST_PULL_S = 5.0


class FlowerTransport:
    """Requests to the sites' Flower nodes; sites are known by name, node ids may change."""

    def __init__(
        self,
        grid: Grid,
        setup: NodeSetup,
        settings: FlowerSettings,
        log=print,
        event=lambda site, level, message: None,
        identities: SiteIdentities | None = None,
    ):
        """``setup``: the run as nodes see it (``use`` switches it, e.g. for the warm-up);
        ``event(site, level, message)``: joins, departures and returns, for the store;
        ``identities``: the key each site is bound to (none: nothing checked)."""
        self.grid = grid
        self.log = log
        self.event = event
        self.setup = setup.to_dict()
        self.expected = settings.expected_sites
        self.settings = settings
        self.started = time.monotonic()
        self.away_since: dict[str, float] = {}  # site → when it stopped answering
        self.node_of: dict[str, int] = {}  # site → its current Flower node id
        self.registrations: dict[str, dict[str, Any]] = {}
        self.summaries: dict[str, dict[str, Any]] = {}
        self._answers: dict[str, dict[str, Any]] = {}  # site → its latest register answer
        # site → content tags of the tensors its node holds (flower_codec.TensorCache), as its
        # last answer said; those travel as tags. Forgotten when the site fails or rejoins.
        self.held: dict[str, list[str]] = {}
        self._refusals: set[str] = set()  # registration errors already shown
        self.identities = identities or SiteIdentities({}, {})
        self._impostors: set[int] = set()  # nodes refused for their key: never asked again

    @property
    def sites(self) -> list[str]:
        return list(self.registrations)

    def use(self, setup: NodeSetup) -> FlowerTransport:
        """Send ``setup`` with the next requests (the nodes rebuild for it); returns self."""
        self.setup = setup.to_dict()
        return self

    def register(self) -> dict[str, dict[str, Any]]:
        """Wait for the expected sites (at least ``min_nodes``), in federation index order."""
        if self.registrations:
            return self.registrations
        deadline = time.monotonic() + self.settings.register_timeout_s
        while len(self.node_of) < self.expected and time.monotonic() < deadline:
            self._discover(timeout=min(30.0, max(1.0, deadline - time.monotonic())))
            time.sleep(0.5)
        if len(self.node_of) < self.settings.min_nodes:
            raise FederationError(
                f"only {len(self.node_of)} site(s) joined within "
                f"{self.settings.register_timeout_s:g} s ({sorted(self.node_of)}); "
                f"min_nodes = {self.settings.min_nodes}"
            )
        order = sorted(self._answers, key=lambda s: self._answers[s]["registration"]["order"])
        for site in order:
            self.registrations[site] = self._answers[site]["registration"]
            self.summaries[site] = self._answers[site]["summary"]
        return self.registrations

    def train(self, requests: Mapping[str, Broadcast]) -> dict[str, Reply | NodeFailure]:
        memo: dict[int, str] = {}  # the sites share the plan's tensors: hash them once
        frames = {
            site: broadcast_frame(b, self.setup, self.held.get(site, []), memo)
            for site, b in requests.items()
        }
        answers = self._ask(frames, "train", self.settings.round_timeout_s)
        return {
            site: answer if isinstance(answer, NodeFailure) else _decode(site, frame_reply, answer)
            for site, answer in answers.items()
        }

    def secure(
        self, step: str, messages: Mapping[str, dict[str, Any]]
    ) -> dict[str, dict[str, Any] | NodeFailure]:
        """One step of secure aggregation at each site: its JSON message there, the answer
        back (``fed_auc.privacy.secure``; the protocol runs in the coordinator and nodes)."""
        frames = {
            site: ({"kind": "secure", "setup": self.setup, "step": step, "message": m}, [])
            for site, m in messages.items()
        }
        answers = self._ask(frames, "query", self.settings.round_timeout_s)
        return {
            site: a if isinstance(a, NodeFailure) else _decode(site, _secure_answer, a)
            for site, a in answers.items()
        }

    def evaluate(
        self,
        sites: Sequence[str],
        tensors: Tensors,
        pooled: bool = True,
        thresholds: list[float] | None = None,
    ) -> dict[str, Evaluation | NodeFailure]:
        header = {"kind": "evaluate", "setup": self.setup, "pooled": pooled}
        if thresholds is not None:  # the nodes bin their test scores around these
            header["thresholds"] = list(thresholds)
        memo: dict[int, str] = {}
        frames = {
            site: tensor_frame(header, tensors, self.held.get(site, []), memo) for site in sites
        }
        answers = self._ask(frames, "evaluate", self.settings.eval_timeout_s)
        return {
            site: a if isinstance(a, NodeFailure) else _decode(site, frame_evaluation, a)
            for site, a in answers.items()
        }

    def report(
        self, sites: Sequence[str], request: Any, tensors: Tensors
    ) -> dict[str, dict[str, Any] | NodeFailure]:
        """The evaluation job (``fed_auc.evaluate.job``): each node scores the model on its
        own splits and answers JSON only; deadline ``eval_timeout_s``."""
        header = {"kind": "report", "setup": self.setup, "request": request.to_dict()}
        memo: dict[int, str] = {}
        frames = {s: tensor_frame(header, tensors, self.held.get(s, []), memo) for s in sites}
        answers = self._ask(frames, "evaluate", self.settings.eval_timeout_s)
        return {
            s: a if isinstance(a, NodeFailure) else _decode(s, lambda frame: frame[0]["report"], a)
            for s, a in answers.items()
        }

    def compare(
        self, sites: Sequence[str], request: Any, tensors: tuple[Tensors, Tensors]
    ) -> dict[str, dict[str, Any] | NodeFailure]:
        """A paired comparison (``fed_auc.node.compare``): each node scores both models
        (one frame, ``pair_tensors``) on its own split and answers JSON only; deadline
        ``eval_timeout_s``."""
        header = {"kind": "compare", "setup": self.setup, "request": request.to_dict()}
        memo: dict[int, str] = {}
        both = pair_tensors(tensors)
        frames = {s: tensor_frame(header, both, self.held.get(s, []), memo) for s in sites}
        answers = self._ask(frames, "evaluate", self.settings.eval_timeout_s)
        return {
            s: a if isinstance(a, NodeFailure) else _decode(s, lambda f: f[0]["comparison"], a)
            for s, a in answers.items()
        }

    def end(self, status: str) -> None:
        """Tell every connected node that the run ended (``status``: ``completed``): each
        says so, and the coordinator going away next is no fault to it. A node that does not
        acknowledge within ``END_TIMEOUT_S`` is not waited for; the run's result stands
        whatever happens to these messages."""
        header = {"kind": "end", "run_id": self.setup["run_id"], "status": status}
        nodes = [n for site, n in self.node_of.items() if site not in self.away_since]
        messages = [
            Message(frame_content(header, []), dst_node_id=n, message_type="query",
                    ttl=END_TIMEOUT_S)
            for n in nodes
        ]  # fmt: skip
        try:
            self._exchange(messages, END_TIMEOUT_S)
        except Exception as exc:  # e.g. the SuperLink stopping: the nodes learn it otherwise
            self.log(f"the nodes were not told that the run ended: {type(exc).__name__}: {exc}")

    # -- messaging ------------------------------------------------------------------------
    def _ask(
        self, frames: Mapping[str, Frame], kind: str, timeout: float
    ) -> dict[str, Frame | NodeFailure]:
        """Send each site its frame; whoever has not answered by the deadline is dropped."""
        self._discover(timeout=min(timeout, 30.0))
        answers: dict[str, Frame | NodeFailure] = {}
        messages = []
        shared: dict[int, Any] = {}  # a buffer sent to several sites: one Flower Array
        for site, (header, buffers) in frames.items():
            if site not in self.node_of:
                answers[site] = NodeFailure(site, "dropped", "node not connected")
                continue
            content = frame_content(header, buffers, shared)
            messages.append(
                Message(content, dst_node_id=self.node_of[site], message_type=kind, ttl=timeout)
            )
        site_of = {node: site for site, node in self.node_of.items()}
        for reply in self._exchange(messages, timeout):
            site = site_of.get(reply.metadata.src_node_id)
            if site is None:
                continue
            if reply.has_error():  # a refusal (e.g. a spent budget) says its status
                status = refused_status(reply.error.reason) or "error"
                answers[site] = NodeFailure(site, status, reply.error.reason)
            else:
                answers[site] = message_frame(reply.content)
        for site in frames:
            answers.setdefault(
                site, NodeFailure(site, "dropped", f"no answer within {timeout:g} s")
            )
        for site, answer in answers.items():
            if isinstance(answer, NodeFailure):
                self.held.pop(site, None)
                if answer.status == "dropped" and site not in self.away_since:
                    self.away_since[site] = time.monotonic()
                    self.event(site, "warning", f"site {site} left: {kind} {answer.message}")
            else:
                self.held[site] = answer[0].get("cached", [])
                if site in self.away_since:  # back, under a new Flower node id or the same
                    away = time.monotonic() - self.away_since.pop(site)
                    self.event(site, "info", f"site {site} rejoined after {away:.1f} s away")
        done = sum(not isinstance(a, NodeFailure) for a in answers.values())
        if kind == "train" and done < min(self.settings.min_nodes, len(frames)):
            raise FederationError(too_few_replies(answers, self.settings.min_nodes))
        return {site: answers[site] for site in frames}

    def _discover(self, timeout: float) -> None:
        """Ask nodes we do not know yet which site they serve (a restarted node reappears)."""
        known = set(self.node_of.values()) | self._impostors
        new = [node for node in self.grid.get_node_ids() if node not in known]
        if not new:
            return
        header = {"kind": "register", "setup": self.setup}
        messages = [
            Message(frame_content(header, []), dst_node_id=n, message_type="query", ttl=timeout)
            for n in new
        ]
        for reply in self._exchange(messages, timeout):
            if reply.has_error():  # e.g. a node that cannot take this setup: say it once
                reason = reply.error.reason
                if reason not in self._refusals:
                    self._refusals.add(reason)
                    self.log(f"a node refused to register: {reason}")
                continue
            answer, _ = message_frame(reply.content)
            site, node = answer["site"], reply.metadata.src_node_id
            refusal = self.identities.claim(site, node)
            if refusal is not None:  # the site keeps its place; its node is not replaced
                self._impostors.add(node)
                self.event(site, "error", f"{refusal} (Flower node {node})")
                continue
            known_before = site in self._answers
            self.node_of[site] = node
            self._answers[site] = answer
            self.held[site] = answer.get("cached", [])
            if known_before:  # a return is recorded when the site answers again
                self.log(f"site {site} reconnected (Flower node {node})")
            else:
                waited = time.monotonic() - self.started
                message = f"site {site} joined after {waited:.1f} s (Flower node {node})"
                self.event(site, "info", message)

    def _exchange(self, messages: list[Message], timeout: float) -> list[Message]:
        """Push the messages, then pull replies every ``PULL_INTERVAL_S`` until all are in
        or the deadline passes, and once more after it: a reply at the SuperLink by the
        deadline counts. No pull outlives the deadline by more than ``LAST_PULL_S``: a reply
        whose node died mid-upload comes back as an error reply, not a 3-minute stall."""
        if not messages:
            return []
        pending = set(self.grid.push_messages(messages))
        deadline = time.monotonic() + timeout
        replies: list[Message] = []
        while pending:
            last = time.monotonic() >= deadline
            with backoff.time_limit(max(deadline - time.monotonic(), LAST_PULL_S)):
                got = list(self.grid.pull_messages(pending))
            replies += got
            pending -= {reply.metadata.reply_to_message_id for reply in got}
            if last:
                break
            if pending and time.monotonic() < deadline:
                time.sleep(PULL_INTERVAL_S)
        return replies


def too_few_replies(answers: Mapping[str, Any], min_nodes: int) -> str:
    """Why a phase cannot complete: how many nodes replied, and which sites missed and why."""
    missed = {s: a for s, a in answers.items() if isinstance(a, NodeFailure)}
    why = "; ".join(f"{site} ({failure.message})" for site, failure in missed.items())
    return (
        f"{len(answers) - len(missed)} of {len(answers)} nodes replied "
        f"(min_nodes {min_nodes}); missed: {why}"
    )


def _secure_answer(frame: Frame) -> dict[str, Any]:
    answer = frame[0]["answer"]
    if not isinstance(answer, dict):
        raise TypeError(f"secure aggregation answer is a {type(answer).__name__}, not a dict")
    return answer


def _decode(site: str, decode, frame: Frame):
    try:
        return decode(frame)
    except (KeyError, TypeError, ValueError) as exc:
        return NodeFailure(site, "error", f"undecodable reply: {type(exc).__name__}: {exc}")
