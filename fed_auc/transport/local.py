"""In-process transport: the coordinator calls each node directly, one after the other.

Sequential on purpose: on a few CPU cores torch already uses every core per node, so
threads would only contend. A node that raises is reported as an ``error`` failure and the
round goes on with the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fed_auc.exchange import Broadcast, Evaluation, NodeFailure, NodeRefused, Reply
from fed_auc.node.node import Node
from fed_auc.trainable import Tensors


class LocalTransport:
    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = {node.name: node for node in nodes}
        if len(self.nodes) != len(nodes):
            raise ValueError("site names must be unique")

    @property
    def sites(self) -> list[str]:
        return list(self.nodes)

    def register(self) -> dict[str, dict[str, Any]]:
        return {name: node.registration() for name, node in self.nodes.items()}

    def train(self, requests: Mapping[str, Broadcast]) -> dict[str, Reply | NodeFailure]:
        """Each site's request (the broadcast, with that site's own config) to its node."""
        return {
            site: self._call(site, lambda n, b=broadcast: n.train(b))
            for site, broadcast in requests.items()
        }

    def secure(
        self, step: str, messages: Mapping[str, dict[str, Any]]
    ) -> dict[str, dict[str, Any] | NodeFailure]:
        """One step of secure aggregation (``fed_auc.privacy.secure``) at each site."""
        return {
            site: self._call(site, lambda n, m=message: n.secure_step(step, m))
            for site, message in messages.items()
        }

    def evaluate(
        self,
        sites: Sequence[str],
        tensors: Tensors,
        pooled: bool = True,
        thresholds: list[float] | None = None,
    ) -> dict[str, Evaluation | NodeFailure]:
        def ask(node):
            return node.evaluate(tensors, pooled=pooled, thresholds=thresholds)

        return {site: self._call(site, ask) for site in sites}

    def report(
        self, sites: Sequence[str], request: Any, tensors: Tensors
    ) -> dict[str, dict[str, Any] | NodeFailure]:
        """The evaluation job (``fed_auc.evaluate.job``): each site scores the model."""
        from fed_auc.node.report import site_report

        return {
            s: self._call(s, lambda n: site_report(n.site, request, tensors, n.compute))
            for s in sites
        }

    def _call(self, site: str, request):
        try:
            return request(self.nodes[site])
        except NodeRefused as exc:  # e.g. a spent privacy budget: the site says why
            return NodeFailure(site, exc.status, str(exc))
        except Exception as exc:  # a failing node must not stop the federation
            return NodeFailure(site, "error", f"{type(exc).__name__}: {exc}")
