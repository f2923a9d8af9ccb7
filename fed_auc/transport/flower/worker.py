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
from typing import Any

import torch

from fed_auc.data.base import SiteData
from fed_auc.data.cards import site_positive_class
from fed_auc.evaluate.job import label_lines
from fed_auc.exchange import ComparisonRequest, EvaluationRequest, NodeRefused
from fed_auc.node.build import build_node
from fed_auc.node.host import NodeHost
from fed_auc.node.setup import NodeSetup
from fed_auc.site import SiteDefinition
from fed_auc.transport.flower.codec import (
    Frame,
    TensorCache,
    evaluation_frame,
    frame_broadcast,
    frame_tensors,
    reply_frame,
    unpair_tensors,
)

log = logging.getLogger("fed_auc.node.node")


class NodeWorker:
    """Answers register / train / evaluate frames with one warm ``Node`` per federated run,
    and the coordinator's word that a run ended."""

    def __init__(
        self, site: SiteDefinition, echo=lambda line: None, on_request=lambda kind: None
    ) -> None:
        """``echo``: where one line per request handled goes (``fed-auc node`` prints it);
        ``on_request(kind)``: told of each request, ``end`` when the coordinator's run ended."""
        self.site = site
        self.echo = echo
        self.on_request = on_request
        self.host = NodeHost(site.hosting(), echo=echo)
        self._setup: NodeSetup | None = None
        self._data: tuple[tuple, SiteData] | None = None  # (NodeSetup.data_key, images)
        self._cache = TensorCache()  # tensors the coordinator need not send again
        if site.threads is not None:
            torch.set_num_threads(site.threads)

    def handle(self, header: dict[str, Any], buffers: list[bytes]) -> Frame:
        """The answer to one request; it also lists the tensors this node holds (``cached``).
        A request this site cannot take (bad input, e.g. a batch larger than its training
        split) is told in one line on this console, and raised for the error reply."""
        try:
            answer, answer_buffers = self._answer(header, buffers)
        except (ValueError, NodeRefused) as exc:  # sent back as the error reply or refusal
            self.echo(f"{self.site.name}: refused a {header.get('kind')} request: {exc}")
            raise
        return {**answer, "cached": self._cache.tags()}, answer_buffers

    def _answer(self, header: dict[str, Any], buffers: list[bytes]) -> Frame:
        kind = header["kind"]
        self.on_request(kind)
        if kind == "end":  # the run is over; the node stays up for the next one
            run, status = header["run_id"], header["status"]
            self.echo(f"{self.site.name}: run {run} {status} at the coordinator; this node "
                      "waits for the next run (Ctrl-C stops it)")  # fmt: skip
            return {"site": self.site.name}, []
        if kind == "report":  # an evaluation job: the site's data, no training node needed
            return self._report(header, buffers), []
        if kind == "compare":  # two models compared on the site's data, as a report
            return self._compare(header, buffers), []
        self._serve(header["setup"])
        host = self.host
        if kind == "register":
            registration = host.register()
            self.echo(f"{self.site.name}: registered for run {self._setup.run_id}")
            return {"site": self.site.name, "registration": registration,
                    "summary": host.summary()}, []  # fmt: skip
        if kind == "train":
            return reply_frame(host.train(frame_broadcast((header, buffers), self._cache)))
        if kind == "secure":  # a step of secure aggregation (fed_auc.privacy.secure)
            return {"answer": host.secure(header["step"], header["message"])}, []
        if kind == "evaluate":
            tensors = frame_tensors((header, buffers), self._cache)
            pooled = bool(header["pooled"])
            return evaluation_frame(host.evaluate(tensors, pooled, header.get("thresholds")))
        raise ValueError(f"unknown request kind {kind!r}")

    def _report(self, header: dict[str, Any], buffers: list[bytes]) -> dict[str, Any]:
        setup = NodeSetup.from_dict(header["setup"])
        request = EvaluationRequest.from_dict(header["request"])
        tensors = frame_tensors((header, buffers), self._cache)
        data, compute = self._site_data(setup), self.site.compute()
        report = self.host.report(request, tensors, setup.run_id, data, compute)
        shown = "; ".join(
            f"{split} {label_lines(labels, site_positive_class(data))}"
            for split, labels in report["splits"].items()
        )
        self.echo(f"{self.site.name}: evaluation job {setup.run_id}: {shown}, "
                  f"{report['duration_s']:.1f} s")  # fmt: skip
        return {"site": self.site.name, "report": report}

    def _compare(self, header: dict[str, Any], buffers: list[bytes]) -> dict[str, Any]:
        setup = NodeSetup.from_dict(header["setup"])
        request = ComparisonRequest.from_dict(header["request"])
        tensors = unpair_tensors(frame_tensors((header, buffers), self._cache))
        data, compute = self._site_data(setup), self.site.compute()
        answer = self.host.compare(request, tensors, setup.run_id, data, compute)
        shown = "; ".join(
            f"{split} [{r['label']}] A − B "
            + ("undefined" if r["difference"] is None else f"{r['difference']:+.3f}")
            for split, rows in answer["splits"].items()
            for r in rows
        )
        self.echo(f"{self.site.name}: comparison {setup.run_id}: {shown}, "
                  f"{answer['duration_s']:.1f} s")  # fmt: skip
        return {"site": self.site.name, "comparison": answer}

    def _serve(self, values: dict[str, Any]) -> None:
        """The node of this run: built on the run's first request (or after a restart)."""
        setup = NodeSetup.from_dict(values)
        if self.host.node is None or setup != self._setup:
            log.info("%s: building the node for run %s", self.site.name, setup.run_id)
            hosting, run_dir = self.site.hosting(), setup.state_dir(self.site.state_dir)
            self.host.admit(setup, self._site_data(setup), run_dir)  # the site's policy first
            node = build_node(setup, self._site_data(setup), hosting, run_dir)
            self.host.hosting = hosting
            self.host.serve(node)
            self._setup = setup

    def _site_data(self, setup: NodeSetup) -> SiteData:
        """The site's images as this setup needs them (read again only when that changes)."""
        key = setup.data_key()
        if self._data is None or self._data[0] != key:
            data = self.site.load(setup.image_size, setup.num_labels, setup.seed, setup.data_scale)
            self._data = (key, data)
        return self._data[1]
