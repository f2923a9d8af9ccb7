"""The long-lived node worker behind ``fed-auc node``: data, model and local state stay warm.

``fed-auc node`` runs Flower's ClientApp tasks in this process (``flower.executor``) and
hands each message to ``NodeWorker.handle``. The worker builds the site's ``Node`` from its
site file and the run's ``NodeSetup`` (which every request carries) with
``fed_auc.node.build.build_node``, as ``fed-auc simulate`` does, and keeps it between
messages; its images are loaded once for all runs that see them alike. The node's local state
lives under ``<state_dir>/<run id>/`` and survives a restart of the node.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from fed_auc.data.base import SiteData
from fed_auc.data.cards import site_summary
from fed_auc.exchange import EvaluationRequest
from fed_auc.metrics.auc import mean_auc
from fed_auc.node.build import build_node
from fed_auc.node.compute import compute_line
from fed_auc.node.node import Node
from fed_auc.node.report import site_report
from fed_auc.node.setup import NodeSetup
from fed_auc.site import SiteDefinition
from fed_auc.transport.flower.codec import (
    Frame,
    TensorCache,
    evaluation_frame,
    frame_broadcast,
    frame_tensors,
    reply_frame,
)

log = logging.getLogger("fed_auc.node.node")


class NodeWorker:
    """Answers register / train / evaluate frames with one warm ``Node`` per federated run."""

    def __init__(self, site: SiteDefinition, echo=lambda line: None) -> None:
        """``echo``: where one line per request handled goes (``fed-auc node`` prints it)."""
        self.site = site
        self.echo = echo
        self._setup: NodeSetup | None = None
        self._node: Node | None = None
        self._data: tuple[tuple, SiteData] | None = None  # (NodeSetup.data_key, images)
        self._latest: tuple[int, int] | None = None  # (round, phase index) of the last train
        self._cache = TensorCache()  # tensors the coordinator need not send again
        if site.threads is not None:
            torch.set_num_threads(site.threads)

    def handle(self, header: dict[str, Any], buffers: list[bytes]) -> Frame:
        """The answer to one request; it also lists the tensors this node holds (``cached``).
        A request this site cannot take (bad input, e.g. a batch larger than its training
        split) is told in one line on this console, and raised for the error reply."""
        try:
            answer, answer_buffers = self._answer(header, buffers)
        except ValueError as exc:  # the executor sends it back as the error reply
            self.echo(f"{self.site.name}: refused a {header.get('kind')} request: {exc}")
            raise
        return {**answer, "cached": self._cache.tags()}, answer_buffers

    def _answer(self, header: dict[str, Any], buffers: list[bytes]) -> Frame:
        kind = header["kind"]
        if kind == "report":  # an evaluation job: the site's data, no training node needed
            return self._report(header, buffers), []
        node = self._node_for(header["setup"])
        if kind == "register":
            registration = {
                **node.registration(),
                "order": list(self.site.order),
                "label_names": list(node.site.label_names),
                "synthetic": self.site.synthetic,
            }
            budget = self.site.budget()
            if budget is not None:
                registration["memory_budget"] = budget
            if self.site.local_steps is not None:  # the coordinator asks for what it will run
                registration["local_steps"] = self.site.local_steps
            summary = site_summary(node.site)
            self.echo(f"{node.name}: registered for run {self._setup.run_id}")
            return {"site": node.name, "registration": registration, "summary": summary}, []
        if kind == "train":
            broadcast = frame_broadcast((header, buffers), self._cache)
            self._refuse_stale(node, broadcast.round, broadcast.phase)
            if self.site.local_steps is not None and "local_steps" in broadcast.config:
                broadcast.config["local_steps"] = self.site.local_steps
            start = time.perf_counter()
            reply = node.train(broadcast)
            loss = reply.metrics.get("train_loss")
            self.echo(
                f"{node.name}: round {broadcast.round + 1} {broadcast.phase}: {reply.steps} steps"
                + ("" if loss is None else f", loss {loss:.4f}")
                + f", {time.perf_counter() - start:.1f} s"
                + compute_line(node.compute, reply.metrics)
            )
            return reply_frame(reply)
        if kind == "secure":  # a step of secure aggregation (fed_auc.privacy.secure)
            return {"answer": node.secure_step(header["step"], header["message"])}, []
        if kind == "evaluate":
            tensors = frame_tensors((header, buffers), self._cache)
            evaluation = node.evaluate(
                tensors, pooled=bool(header["pooled"]), thresholds=header.get("thresholds")
            )
            aucs = {name: mean_auc(split.aucs) for name, split in evaluation.splits.items()}
            shown = ", ".join(
                f"{name} AUC {'undefined' if auc is None else f'{auc:.3f}'}"
                for name, auc in aucs.items()
            )
            self.echo(f"{node.name}: evaluated: {shown}, {evaluation.duration_s:.1f} s")
            return evaluation_frame(evaluation)
        raise ValueError(f"unknown request kind {kind!r}")

    def _report(self, header: dict[str, Any], buffers: list[bytes]) -> dict[str, Any]:
        setup = NodeSetup.from_dict(header["setup"])
        request = EvaluationRequest.from_dict(header["request"])
        tensors = frame_tensors((header, buffers), self._cache)
        report = site_report(self._site_data(setup), request, tensors, self.site.compute())
        shown = ", ".join(
            f"{split} AUC " + " ".join(_fmt(r["auc"]) for r in labels.values())
            for split, labels in report["splits"].items()
        )
        self.echo(f"{self.site.name}: evaluation job {setup.run_id}: {shown}, "
                  f"{report['duration_s']:.1f} s")  # fmt: skip
        return {"site": self.site.name, "report": report}

    def _refuse_stale(self, node: Node, round_: int, phase: str) -> None:
        """A request that arrives after a later one (its deadline passed while Flower started
        the ClientApp) must not overwrite the later reply's pending state."""
        position = (round_, node.backend.phases.index(phase))
        if self._latest is not None and position < self._latest:
            raise ValueError(f"stale request for round {round_ + 1}: already past it")
        self._latest = position

    def _node_for(self, values: dict[str, Any]) -> Node:
        """The node of this run: built on the run's first request (or after a restart)."""
        setup = NodeSetup.from_dict(values)
        if self._node is None or setup != self._setup:
            log.info("%s: building the node for run %s", self.site.name, setup.run_id)
            self._node = build_node(
                setup,
                self._site_data(setup),
                self.site.seed_index,
                self.site.state_dir / setup.run_id,
                memory_budget=self.site.budget(),
                augment=self.site.augment,
                tta=self.site.tta,
                local_steps=self.site.local_steps,
                compute=self.site.compute(),
            )
            self._setup = setup
            self._latest = None
        return self._node

    def _site_data(self, setup: NodeSetup) -> SiteData:
        """The site's images as this setup needs them (read again only when that changes)."""
        key = setup.data_key()
        if self._data is None or self._data[0] != key:
            data = self.site.load(setup.image_size, setup.num_labels, setup.seed, setup.data_scale)
            self._data = (key, data)
        return self._data[1]


def _fmt(auc: float | None) -> str:
    return "undefined" if auc is None else f"{auc:.3f}"
