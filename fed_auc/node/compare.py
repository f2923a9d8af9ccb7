"""A site's answer to a paired comparison: two models scored on the same split of its own data,
each with its own card's TTA (``fed_auc.node.report.site_scores``), answered per label as
``fed_auc.metrics.paired.paired_auc_differences`` gives it. The scores stay here: only AUCs,
their difference, its DeLong interval, se, p and counts leave the node.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import torch

from fed_auc.data.base import SiteData
from fed_auc.exchange import ComparisonRequest
from fed_auc.metrics.paired import paired_auc_differences
from fed_auc.node.compute import Compute
from fed_auc.node.report import site_scores


def check_pair(request: ComparisonRequest) -> None:
    """The two models must score the same labels on the same splits: a pair, or nothing."""
    a, b = request.a, request.b
    if a.label_names != b.label_names:
        raise ValueError(f"the two models score different labels: {a.label_names} vs "
                         f"{b.label_names}")  # fmt: skip
    if a.splits != b.splits:
        raise ValueError(f"a comparison scores both models on the same splits: {a.splits} vs "
                         f"{b.splits}")  # fmt: skip


def site_comparison(
    data: SiteData,
    request: ComparisonRequest,
    tensors: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]],
    compute: Compute | None = None,
) -> dict[str, Any]:
    """On the node: per split, a list (one per label, named) of the paired differences of
    model A's AUC minus model B's on the same images; no scores."""
    check_pair(request)
    start = time.perf_counter()
    scored_a = site_scores(data, request.a, tensors[0], compute)
    scored_b = site_scores(data, request.b, tensors[1], compute)
    out: dict[str, Any] = {"site": data.name, "splits": {}}
    for split, (labels, a) in scored_a.items():
        results = paired_auc_differences(labels, a, scored_b[split][1], request.level)
        out["splits"][split] = [
            {"label": name, **asdict(result)}
            for name, result in zip(request.a.label_names, results, strict=True)
        ]
    out["duration_s"] = time.perf_counter() - start
    return out
