"""The long-lived node worker behind ``fed-auc node``: data, model and local state stay warm.

``fed-auc node`` runs Flower's ClientApp tasks in this process (``flower.executor``) and
hands each message to ``NodeWorker.handle``. The worker builds the site's ``Node`` once per
federated run, from the run's setup (algorithm, hyperparameters, model, seed) that every
request carries, and keeps it between messages; the node's local state lives under
``<state_dir>/<run id>/`` and survives a restart of the node.
"""

from __future__ import annotations

import logging
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fed_auc.algorithms import build_backend
from fed_auc.data.synthetic import (
    FINDINGS,
    GENERIC_FINDING,
    SiteProfile,
    _derive,
    _scaled,
    make_site,
)
from fed_auc.node import Node
from fed_auc.privacy import Privacy
from fed_auc.simulation import site_summary
from fed_auc.transport.flower.codec import (
    Frame,
    TensorCache,
    evaluation_frame,
    frame_broadcast,
    frame_tensors,
    reply_frame,
)

log = logging.getLogger("fed_auc.node")

NODE_KEYS = {"data", "index", "state_dir", "local_steps", "memory_budget_mb", "threads"}


@dataclass(frozen=True)
class SiteConfig:
    """A site TOML: the synthetic profile plus the ``[node]`` table of the node that serves it."""

    path: Path
    name: str
    profile: SiteProfile
    index: int  # position in the federation: seeds the site's images and its batch sampler
    state_dir: Path
    local_steps: int | None = None  # τ_i this site runs, whatever the coordinator asks
    memory_budget_mb: int | None = None  # reported at registration (for partial training)
    threads: int | None = None  # torch threads of the worker

    @classmethod
    def from_toml(cls, path: str | Path) -> SiteConfig:
        path = Path(path)
        profile = SiteProfile.from_toml(path)
        node = tomllib.loads(path.read_text(encoding="utf-8")).get("node")
        if not isinstance(node, dict):
            raise ValueError(f"{path}: missing [node] table (state_dir, index, ...)")
        unknown = sorted(set(node) - NODE_KEYS)
        if unknown:
            raise ValueError(f"{path}: unknown [node] key(s) {unknown}; valid: {sorted(NODE_KEYS)}")
        if node.get("data", "synthetic") != "synthetic":
            raise ValueError(f"{path}: [node] data = {node['data']!r}: only 'synthetic' is known")
        for key in ("index", "local_steps", "memory_budget_mb", "threads"):
            value = node.get(key)
            low = 0 if key == "index" else 1
            if (key == "index" or value is not None) and not (
                isinstance(value, int) and not isinstance(value, bool) and value >= low
            ):
                raise ValueError(f"{path}: [node] {key} = {value!r}: must be an integer ≥ {low}")
        if not isinstance(node.get("state_dir"), str):
            raise ValueError(f"{path}: [node] state_dir must be a path string")
        return cls(
            path,
            profile.name,
            profile,
            node["index"],
            Path(node["state_dir"]),
            node.get("local_steps"),
            node.get("memory_budget_mb"),
            node.get("threads"),
        )


class NodeWorker:
    """Answers register / train / evaluate frames with one warm ``Node`` per federated run."""

    def __init__(self, site: SiteConfig) -> None:
        self.site = site
        self._setup: dict[str, Any] | None = None
        self._node: Node | None = None
        self._latest: tuple[int, int] | None = None  # (round, phase index) of the last train
        self._cache = TensorCache()  # tensors the coordinator need not send again
        if site.threads is not None:
            torch.set_num_threads(site.threads)

    def handle(self, header: dict[str, Any], buffers: list[bytes]) -> Frame:
        """The answer to one request; it also lists the tensors this node holds (``cached``)."""
        answer, answer_buffers = self._answer(header, buffers)
        return {**answer, "cached": self._cache.tags()}, answer_buffers

    def _answer(self, header: dict[str, Any], buffers: list[bytes]) -> Frame:
        node = self._node_for(header["setup"])
        kind = header["kind"]
        if kind == "register":
            registration = {**node.registration(), "index": self.site.index}
            if self.site.memory_budget_mb is not None:
                registration["memory_budget_mb"] = self.site.memory_budget_mb
            summary = site_summary(node.site)
            return {"site": node.name, "registration": registration, "summary": summary}, []
        if kind == "train":
            broadcast = frame_broadcast((header, buffers), self._cache)
            self._refuse_stale(node, broadcast.round, broadcast.phase)
            if self.site.local_steps is not None and "local_steps" in broadcast.config:
                broadcast.config["local_steps"] = self.site.local_steps
            return reply_frame(node.train(broadcast))
        if kind == "evaluate":
            tensors = frame_tensors((header, buffers), self._cache)
            return evaluation_frame(node.evaluate(tensors, pooled=bool(header["pooled"])))
        raise ValueError(f"unknown request kind {kind!r}")

    def _refuse_stale(self, node: Node, round_: int, phase: str) -> None:
        """A request that arrives after a later one (its deadline passed while Flower started
        the ClientApp) must not overwrite the later reply's pending state."""
        position = (round_, node.backend.phases.index(phase))
        if self._latest is not None and position < self._latest:
            raise ValueError(f"stale request for round {round_ + 1}: already past it")
        self._latest = position

    def _node_for(self, setup: dict[str, Any]) -> Node:
        """The node of this run: built on the run's first request (or after a restart)."""
        if self._node is None or setup != self._setup:
            log.info("%s: building the node for run %s", self.site.name, setup["run_id"])
            self._node = build_node(self.site, setup)
            self._setup = setup
            self._latest = None
        return self._node


def build_node(site: SiteConfig, setup: dict[str, Any]) -> Node:
    """The same node ``fed-auc simulate`` builds for this site (same data, seeds, state)."""
    num_labels = setup["num_labels"]
    labels = [GENERIC_FINDING] if num_labels == 1 else list(FINDINGS[:num_labels])
    profile = _scaled(site.profile, setup["data_scale"])
    data = make_site(profile, setup["image_size"], labels, _derive(setup["seed"], site.index))
    backend = build_backend(setup["algorithm"], **setup["hyperparameters"])
    return Node(
        data,
        backend,
        setup["model_config"],
        setup["loss"],
        state_dir=site.state_dir / setup["run_id"],
        batch_size=setup["batch_size"],
        min_pos_fraction=setup["min_pos_fraction"],
        min_neg_fraction=setup["min_neg_fraction"],
        seed=setup["seed"] * 1000 + site.index,
        privacy=_privacy(setup),
        augment=setup.get("augment", "none"),
        tta=setup.get("tta"),  # None: the default for its augmentation
    )


def _privacy(setup: dict[str, Any]) -> Privacy | None:
    """Client-side DP as the experiment asks (clip and noise applied here, on the node)."""
    if setup.get("dp_clip") is None:
        return None
    return Privacy(setup["dp_clip"], setup.get("dp_noise", 0.0), setup["seed"])
