"""The request host: one site's answers to the federation, whichever transport carries them.

``LocalTransport`` (in-process) and the Flower node worker both hand each request to a
``NodeHost``; the transports only move requests and replies. So a site registers with the same
fields, runs its own τ_i, refuses a stale request and prints the same console line in
``fed-auc simulate`` and behind ``fed-auc node``; and every request passes the site's policy
(``fed_auc.node.policy.guard``) here, the one place both transports share.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fed_auc.data.base import SiteData
from fed_auc.data.cards import site_positive_class, site_summary
from fed_auc.exchange import (
    Broadcast,
    ComparisonRequest,
    Evaluation,
    EvaluationRequest,
    Reply,
)
from fed_auc.exchange.compression import received_broadcast
from fed_auc.metrics.auc import mean_auc
from fed_auc.metrics.wording import auc_text, class_text
from fed_auc.node.compare import site_comparison
from fed_auc.node.compute import Compute, compute_line
from fed_auc.node.node import Node
from fed_auc.node.policy.guard import PolicyGuard
from fed_auc.node.report import site_report
from fed_auc.node.setup import NodeSetup, SiteHosting
from fed_auc.trainable import Tensors


class NodeHost:
    """Answers register / train / secure / evaluate / report / compare for the node it
    currently serves."""

    def __init__(
        self,
        hosting: SiteHosting,
        node: Node | None = None,
        echo: Callable[[str], None] = print,
        self_approved: bool = False,
    ) -> None:
        """``hosting``: what the site's operator chose (its site file); ``node``: the node of
        the run being served (``serve`` swaps it when a new run starts); ``echo``: where one
        line per request goes (``fed-auc node`` prints it; in-process, nowhere);
        ``self_approved``: the operator runs the coordinator too (``fed-auc simulate``)."""
        self.hosting = hosting
        self.echo = echo
        self.guard = PolicyGuard(hosting.policy, hosting.name, echo, self_approved)
        self.run_id: str | None = None  # the run last admitted, and its experiment
        self.setup: NodeSetup | None = None
        self.node: Node | None = None
        self._latest: tuple[int, int] | None = None  # (round, phase index) of the last train
        if node is not None:
            self.serve(node)

    def admit(self, setup: NodeSetup, data: SiteData, run_dir: Path) -> None:
        """Check a run's experiment against the policy before its node is built or serves
        (``PolicyRefused`` / ``NotApproved`` otherwise); ``run_dir``: its local state."""
        self.guard.admit(setup, data, Path(run_dir))
        self.run_id, self.setup = setup.run_id, setup

    def serve(self, node: Node) -> None:
        """Answer for ``node`` from now on (a new run, or the same run after a restart)."""
        self.node = node
        self._latest = None

    def _current(self) -> Node:
        if self.node is None:
            raise RuntimeError("no node to answer with: serve(node) first")
        return self.node

    def register(self) -> dict[str, Any]:
        """Aggregate counts and the site's own settings; no images, no labels."""
        node = self._current()
        registration = {
            **node.registration(),
            "order": list(self.hosting.order),
            "label_names": list(node.site.label_names),
            "synthetic": self.hosting.synthetic,
        }
        if self.hosting.memory_budget is not None:
            registration["memory_budget"] = self.hosting.memory_budget
        if self.hosting.local_steps is not None:  # the coordinator asks for what it will run
            registration["local_steps"] = self.hosting.local_steps
        return registration

    def summary(self) -> dict[str, Any]:
        """The site's data card summary, recorded with the run."""
        return site_summary(self._current().site)

    def train(self, broadcast: Broadcast) -> Reply:
        """One local update. A request that arrives after a later one (its deadline passed
        while the transport delivered it) is refused: it must not overwrite the later reply's
        pending state. The site's own τ_i (its file) wins over the one asked for."""
        node = self._current()
        self.guard.train(broadcast, self.setup)
        broadcast = received_broadcast(broadcast)  # a compressed request, decoded
        position = (broadcast.round, node.backend.phases.index(broadcast.phase))
        if self._latest is not None and position < self._latest:
            raise ValueError(f"stale request for round {broadcast.round + 1}: already past it")
        self._latest = position
        if self.hosting.local_steps is not None and "local_steps" in broadcast.config:
            # a copy: the caller's request (in-process, the coordinator's own) stays as sent
            config = {**broadcast.config, "local_steps": self.hosting.local_steps}
            broadcast = dataclasses.replace(broadcast, config=config)
        start = time.perf_counter()
        reply = node.train(broadcast)
        loss = reply.metrics.get("train_loss")
        self.echo(
            f"{node.name}: round {broadcast.round + 1} {broadcast.phase}: {reply.steps} steps"
            + ("" if loss is None else f", loss {loss:.4f}")
            + f", {time.perf_counter() - start:.1f} s"
            + compute_line(node.compute, reply.metrics)
        )
        return reply

    def secure(self, step: str, message: dict[str, Any]) -> dict[str, Any]:
        """One step of secure aggregation (``fed_auc.privacy.secure``)."""
        if self.setup is not None:
            self.guard.approved(self.setup, "secure")
        return self._current().secure_step(step, message)

    def evaluate(
        self, tensors: Tensors, pooled: bool, thresholds: list[float] | None = None
    ) -> Evaluation:
        """Score the model on the site's validation and test splits."""
        node = self._current()
        self.guard.evaluate(node.site, ("val", "test"), pooled, "evaluate")
        evaluation = node.evaluate(tensors, pooled=pooled, thresholds=thresholds)
        shown = f"{evaluated_text(evaluation, node.site)}, {evaluation.duration_s:.1f} s"
        self.echo(f"{node.name}: evaluated the global model: {shown}")
        return evaluation

    def report(
        self,
        request: EvaluationRequest,
        tensors: Tensors,
        run_id: str | None = None,
        data: SiteData | None = None,
        compute: Compute | None = None,
    ) -> dict[str, Any]:
        """An evaluation job's report (``fed_auc.node.report``) on ``data`` (default: the
        served node's) for ``run_id`` (default: the run admitted), once the policy allows its
        run and splits."""
        data, compute = self._admitted("report", [request], run_id, data, compute)
        return site_report(data, request, tensors, compute)

    def compare(
        self,
        request: ComparisonRequest,
        tensors: tuple[Tensors, Tensors],
        run_id: str | None = None,
        data: SiteData | None = None,
        compute: Compute | None = None,
    ) -> dict[str, Any]:
        """A paired comparison of two models (``fed_auc.node.compare``), once the policy
        allows what an evaluation job of each model would ask: its run, and its splits (no
        per-image score leaves). Arguments as ``report``."""
        data, compute = self._admitted("compare", [request.a, request.b], run_id, data, compute)
        return site_comparison(data, request, tensors, compute)

    def _admitted(
        self,
        what: str,
        requests: list[EvaluationRequest],
        run_id: str | None,
        data: SiteData | None,
        compute: Compute | None,
    ) -> tuple[SiteData, Compute | None]:
        """The data and compute a scoring job runs on (default: the served node's), once the
        policy allows its run (default: the run admitted) and every request's splits; a
        refusal is logged as ``what``."""
        if data is None:
            node = self._current()
            data, compute = node.site, node.compute
        run_id = self.run_id if run_id is None else run_id
        if run_id is not None:
            self.guard.check_experiment(run_id, what)
        for request in requests:
            self.guard.evaluate(data, request.splits, False, what)
        return data, compute


def evaluated_text(evaluation: Evaluation, site: SiteData) -> str:
    """``val AUC 0.812, test AUC 0.790, positive class malignant`` (the mean over labels
    where there are several, said so)."""
    mean = " (mean over labels)" if site.num_labels > 1 else ""
    shown = [f"{name} {auc_text(mean_auc(s.aucs))}" for name, s in evaluation.splits.items()]
    return ", ".join(shown) + f"{mean}, positive class {class_text(site_positive_class(site))}"
