"""In-process transport: the coordinator calls each node directly, one after the other.

Sequential on purpose: on a few CPU cores torch already uses every core per node, so
threads would only contend. A node that raises is reported as an ``error`` failure and the
round goes on with the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fed_auc.exchange import Broadcast, Evaluation, NodeFailure, NodeRefused, Reply
from fed_auc.node.host import NodeHost
from fed_auc.node.node import Node
from fed_auc.node.setup import NodeSetup, SiteHosting
from fed_auc.trainable import Tensors


class LocalTransport:
    def __init__(
        self,
        nodes: Sequence[Node],
        hostings: Sequence[SiteHosting] | None = None,
        setup: NodeSetup | None = None,
    ) -> None:
        """``hostings``: each site's own settings (its file), in the order of ``nodes``; None
        for nodes built by hand (a test, a script): the site's index is its place in the list.
        ``setup``: the experiment, checked against each site's policy; in-process, the one who
        runs it is every site's operator, so it needs no approval."""
        if hostings is None:
            hostings = [SiteHosting(n.name, i, (i, n.name)) for i, n in enumerate(nodes)]
        self.hosts = {
            node.name: NodeHost(hosting, node, echo=lambda line: None, self_approved=True)
            for node, hosting in zip(nodes, hostings, strict=True)
        }
        if len(self.hosts) != len(nodes):
            raise ValueError("site names must be unique")
        for node in nodes if setup is not None else ():
            self.hosts[node.name].admit(setup, node.site, node.state_path.parent)

    @property
    def sites(self) -> list[str]:
        return list(self.hosts)

    @property
    def nodes(self) -> dict[str, Node]:
        return {site: host.node for site, host in self.hosts.items()}

    def register(self) -> dict[str, dict[str, Any]]:
        return {site: host.register() for site, host in self.hosts.items()}

    def train(self, requests: Mapping[str, Broadcast]) -> dict[str, Reply | NodeFailure]:
        """Each site's request (the broadcast, with that site's own config) to its node."""
        return {
            site: self._call(site, lambda h, b=broadcast: h.train(b))
            for site, broadcast in requests.items()
        }

    def secure(
        self, step: str, messages: Mapping[str, dict[str, Any]]
    ) -> dict[str, dict[str, Any] | NodeFailure]:
        """One step of secure aggregation (``fed_auc.privacy.secure``) at each site."""
        return {
            site: self._call(site, lambda h, m=message: h.secure(step, m))
            for site, message in messages.items()
        }

    def evaluate(
        self,
        sites: Sequence[str],
        tensors: Tensors,
        pooled: bool = True,
        thresholds: list[float] | None = None,
    ) -> dict[str, Evaluation | NodeFailure]:
        def ask(host: NodeHost) -> Evaluation:
            return host.evaluate(tensors, pooled=pooled, thresholds=thresholds)

        return {site: self._call(site, ask) for site in sites}

    def report(
        self, sites: Sequence[str], request: Any, tensors: Tensors
    ) -> dict[str, dict[str, Any] | NodeFailure]:
        """The evaluation job (``fed_auc.evaluate.job``): each site scores the model."""

        def score(host: NodeHost) -> dict[str, Any]:
            return host.report(request, tensors)

        return {site: self._call(site, score) for site in sites}

    def compare(
        self, sites: Sequence[str], request: Any, tensors: tuple[Tensors, Tensors]
    ) -> dict[str, dict[str, Any] | NodeFailure]:
        """A paired comparison of two models (``fed_auc.node.compare``) at each site."""

        def pair(host: NodeHost) -> dict[str, Any]:
            return host.compare(request, tensors)

        return {site: self._call(site, pair) for site in sites}

    def _call(self, site: str, request):
        try:
            return request(self.hosts[site])
        except NodeRefused as exc:  # e.g. a spent privacy budget: the site says why
            return NodeFailure(site, exc.status, str(exc))
        except Exception as exc:  # a failing node must not stop the federation
            return NodeFailure(site, "error", f"{type(exc).__name__}: {exc}")
