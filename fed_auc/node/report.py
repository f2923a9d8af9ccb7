"""A site's report for an evaluation job: the model scored on its splits, as counts, ROC points and
binned scores (never per-image scores).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from fed_auc.data.base import SiteData
from fed_auc.exchange import MODEL_FORMAT, EvaluationRequest
from fed_auc.metrics.report import label_result
from fed_auc.models import model_from_config
from fed_auc.node.compute import Compute
from fed_auc.tta import predict


def site_report(
    data: SiteData,
    request: EvaluationRequest,
    tensors: dict[str, torch.Tensor],
    compute: Compute | None = None,
) -> dict[str, Any]:
    """On the node: per split and label, everything ``label_result`` reports; no scores.
    ``compute``: the node's device and precision for scoring (None: fp32 on the CPU)."""
    start = time.perf_counter()
    names = request.label_names
    out: dict[str, Any] = {"site": data.name, "splits": {}}
    for split, (labels, scores) in site_scores(data, request, tensors, compute).items():
        out["splits"][split] = {
            label: label_result(
                labels[:, j], scores[:, j], request.thresholds[j], request.bootstrap, request.seed
            )
            for j, label in enumerate(names)
        }
    out["duration_s"] = time.perf_counter() - start
    return out


def site_scores(
    data: SiteData,
    request: EvaluationRequest,
    tensors: dict[str, torch.Tensor],
    compute: Compute | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The model of ``request`` scored on each of its splits with its TTA: split → (labels,
    scores), both (N, L). Stays on the node: the one scoring an evaluation job's report and a
    comparison share."""
    if request.model_format != MODEL_FORMAT:
        raise ValueError(
            f"unknown model format {request.model_format!r}; this node reads {MODEL_FORMAT}"
        )
    if data.num_labels != len(request.label_names):
        raise ValueError(f"site {data.name}: data has {data.num_labels} label(s), the model "
                         f"{len(request.label_names)}")  # fmt: skip
    model = model_from_config(request.model_config)
    model.load_state_dict(tensors)
    compute = compute or Compute(torch.device("cpu"))
    model.to(compute.device)
    out = {}
    for split in request.splits:
        part = getattr(data, split)
        with compute.autocast():
            scores = predict(model, part.images, request.tta)
        out[split] = (part.labels.numpy(), np.asarray(scores))
    return out
