"""What travels between the coordinator and a node, read by every layer.

The coordinator sends a ``Broadcast`` (one phase of one round) and a node answers a
``Reply`` whose tensors follow the phase's ``ReplyLayout``; an evaluation answers an
``Evaluation`` (per split: counts, AUCs, ROC points, binned scores); an evaluation job asks
with an ``EvaluationRequest``; a node that does not answer usefully is a ``NodeFailure``.
``MODEL_FORMAT`` names the exported model file's layout. As MONAI's ``ExchangeObject`` and
Flower's ``Message``, the message types sit below both ends: nothing here imports the
coordinator, the node or a transport.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from fed_auc.metrics.auc import AUCResult
from fed_auc.trainable import Tensors


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
