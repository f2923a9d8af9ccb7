"""What travels between the coordinator and a node, read by every layer.

The coordinator sends a ``Broadcast`` (one phase of one round) and a node answers a
``Reply`` whose tensors follow the phase's ``ReplyLayout``; an evaluation answers an
``Evaluation`` (per split: counts, AUCs, ROC points, binned scores); an evaluation job asks
with an ``EvaluationRequest`` (two models compared: a ``ComparisonRequest``); a node that
does not answer usefully is a ``NodeFailure``.
``MODEL_FORMAT`` names the exported model file's layout. ``Transport`` is everything a
transport provides (in-process, Flower, or a new one): a site's answer to ``register`` is a
``Registration``. As MONAI's ``ExchangeObject`` and Flower's ``Message``, the message types sit
below both ends: nothing here imports the coordinator, the node, the model or a transport.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NotRequired, Protocol, TypedDict

import numpy as np
import torch

from fed_auc.metrics.auc import AUCResult

Tensors = dict[str, torch.Tensor]  # named tensors: what every payload carries


class NodeRefused(RuntimeError):
    """A node declining a request on purpose, not failing: ``status`` is what the
    coordinator records for it (e.g. ``budget_spent``). A transport that carries only text
    sends ``refusal(exc)``, and the other end reads the status back with ``refused_status``."""

    status = "refused"


def refusal(exc: NodeRefused) -> str:
    """The refusal as one line of text: ``refused[STATUS]: message``."""
    return f"refused[{exc.status}]: {exc}"


def refused_status(reason: str) -> str | None:
    """The status of a refusal sent as text (``refusal``), None for any other error."""
    match = re.search(r"refused\[(\w+)\]: ", reason)
    return match.group(1) if match else None


@dataclass(frozen=True)
class NodeFailure:
    """A node that did not answer usefully: ``dropped`` (no answer in time) or ``error``."""

    site: str
    status: str
    message: str


def payload_bytes(tensors: Tensors) -> int:
    """Bytes of tensor data in a payload: what crosses the wire, before any framing."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


@dataclass
class Broadcast:
    """What the server sends to every selected node for one phase of one round."""

    round: int
    phase: str
    tensors: Tensors
    config: dict[str, Any]


@dataclass
class Reply:
    """What a node sends back: named tensors plus counts; never data or per-image scores."""

    tensors: Tensors
    steps: int
    metrics: dict[str, float] = field(default_factory=dict)
    num_examples: int = 0  # filled in by the node, which knows its data
    site: str = ""
    round: int | None = None  # the broadcast's round and phase, echoed by the node so the
    phase: str | None = None  # coordinator can refuse a reply meant for another request
    trained_groups: list[str] | None = None  # partial training: the layer groups sent; None = all


@dataclass(frozen=True)
class ReplyLayout:
    """The tensors a reply of one phase carries: for every prefix, one tensor per variable
    (primal and dual; ``""`` = the iterates themselves), plus the buffers if ``buffers``."""

    prefixes: tuple[str, ...] = ("",)
    buffers: bool = True


@dataclass
class SplitEvaluation:
    """A model scored on one split of one site."""

    n: int
    positives: list[int]
    aucs: list[AUCResult]
    scores: np.ndarray | None = None  # (N, L), only when pooled scoring is on
    labels: np.ndarray | None = None
    roc: list[dict[str, Any]] | None = None  # per label, ≤ 101 points; test split only
    bins: list[dict[str, Any]] | None = None  # per label, ScoreBins.to_dict(); test split only


@dataclass
class Evaluation:
    site: str
    splits: dict[str, SplitEvaluation] = field(default_factory=dict)
    duration_s: float = 0.0
    personal: dict[str, SplitEvaluation] | None = None  # the site's personal model, if any


MODEL_FORMAT = "fed-auc-model/1"
# A reply's metrics about its compute (fed_auc.node.compute.Meter); the site's device and
# precision are in its registration. The coordinator records them per site and round.
COMPUTE_METRICS = ("images_per_s", "host_peak_mib", "device_peak_mib")


@dataclass(frozen=True)
class EvaluationRequest:
    """What every node needs to score the model as its card says (JSON-able)."""

    model_format: str
    model_config: dict[str, Any]
    label_names: list[str]
    thresholds: list[float]
    tta: str
    splits: list[str]
    bootstrap: int
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EvaluationRequest:
        return cls(**values)


@dataclass(frozen=True)
class ComparisonRequest:
    """Two models to score on the same split of every node, each as its own card says
    (``a``, ``b``: their evaluation requests, same labels and splits); a node answers per
    label only the paired difference of their AUCs at ``level`` (DeLong), never a score."""

    a: EvaluationRequest
    b: EvaluationRequest
    level: float = 0.95

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a.to_dict(), "b": self.b.to_dict(), "level": self.level}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ComparisonRequest:
        a, b = (EvaluationRequest.from_dict(values[k]) for k in ("a", "b"))
        return cls(a, b, float(values.get("level", 0.95)))


class Registration(TypedDict):
    """What a site registers with (``fed_auc.node.host.NodeHost.register``): aggregate counts
    of its training split and its operator's settings; never images or labels."""

    n: int  # training examples
    positives: list[int]  # per label
    known: list[int]  # per label: examples whose label is known
    trained_groups: list[str] | None  # partial training: the layer groups it trains
    device: str  # where it computes (``fed_auc.node.compute.Compute.describe``)
    precision: str
    order: list[Any]  # its place in the federation (index, name)
    label_names: list[str]
    synthetic: bool  # synthetic data: the data-kind defaults of the experiment
    memory_budget: NotRequired[float | int | str]  # its own, when its file sets one
    local_steps: NotRequired[int]  # its own τ_i, when its file sets one


class Transport(Protocol):
    """What a transport provides: the coordinator, the run frame (``fed_auc.run.frame``) and
    the evaluation job ask the sites' nodes through this and nothing else.

    A failure to answer is a ``NodeFailure`` in the answers, never an exception, unless too
    few sites answered for the round to go on (``FederationError``). The setup (a
    ``fed_auc.node.setup.NodeSetup``) is what the nodes of a run are built from; it travels
    with the requests."""

    @property
    def sites(self) -> list[str]:
        """The registered sites, in federation order."""

    @property
    def summaries(self) -> dict[str, dict[str, Any]]:
        """Each registered site's data card summary (``fed_auc.data.cards.site_summary``)."""

    def use(self, setup: Any) -> Transport:
        """Send ``setup`` with the next requests (the nodes rebuild for it); returns a
        transport to the same sites. The run's warm-up is another setup on the same sites."""

    def register(self) -> dict[str, Registration]:
        """Each site's registration, in federation order: asked once per run, by the frame."""

    def train(self, requests: Mapping[str, Broadcast]) -> dict[str, Reply | NodeFailure]:
        """Each site's own request (the broadcast, with that site's config) to its node."""

    def secure(
        self, step: str, messages: Mapping[str, dict[str, Any]]
    ) -> dict[str, dict[str, Any] | NodeFailure]:
        """One step of secure aggregation (``fed_auc.privacy.secure``) at each site."""

    def evaluate(
        self,
        sites: Sequence[str],
        tensors: Tensors,
        pooled: bool = True,
        thresholds: list[float] | None = None,
    ) -> dict[str, Evaluation | NodeFailure]:
        """The model scored on each site's validation and test splits; ``pooled``: with the
        scores (in-process, or Flower with pooled scoring); ``thresholds``: bin around them."""

    def report(
        self, sites: Sequence[str], request: EvaluationRequest, tensors: Tensors
    ) -> dict[str, dict[str, Any] | NodeFailure]:
        """An evaluation job (``fed_auc.evaluate.job``): each site's report, JSON only."""

    def compare(
        self, sites: Sequence[str], request: ComparisonRequest, tensors: tuple[Tensors, Tensors]
    ) -> dict[str, dict[str, Any] | NodeFailure]:
        """A paired comparison (``fed_auc.evaluate.federated_compare``): each site scores
        both models (``tensors``: A's, B's) and answers per label their paired difference."""

    def end(self, status: str) -> None:
        """Tell the nodes the run ended (``completed``): its result stands whatever happens."""
