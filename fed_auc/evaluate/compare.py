"""Two runs' exported models on the same test images: per site, label and pooled, AUC of A
minus AUC of B with DeLong's paired interval (``fed_auc.metrics.paired``).

A comparison is only fair on the same images: two runs that did not run on the same sites and
split are refused, naming what differs. Both models are scored here, where the images are,
each with its own card's test-time augmentation (``fed_auc.evaluate.local.score_sites``);
only the per-site figures go to the store (``fed_auc.store.comparisons``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fed_auc.data.base import Split
from fed_auc.evaluate.local import card_positive_class, score_sites
from fed_auc.metrics.paired import paired_auc_differences
from fed_auc.metrics.report import POOLED
from fed_auc.models import DenseNetClassifier
from fed_auc.node.compute import Compute
from fed_auc.tta import check_tta

# The recorded settings that decide which images are a run's test images, and how they read.
SAME_SPLIT = {
    "data": "data",
    "site_files": "site files",
    "partition": "partition",
    "sites": "number of sites",
    "seed": "seed (it makes the split)",
    "data_scale": "data scale",
    "feature_shift": "feature shift",
    "hold_out": "hold-out sites",
    "image_size": "image size",
    "num_labels": "number of labels",
    "positive_label": "positive label",
    "positive_class": "positive class",
    "classes": "classes",
    "uncertain": "uncertain labels",
    "frontal_only": "frontal only",
    "skip_bad_images": "skip bad images",
    "aspect": "aspect",
    "site_data": "sites' data (names, files, digests)",
}
SPLIT = "test"


def model_dir(runs_dir: str | Path, run_id: str) -> Path:
    """Where a run exported its model (``fed-auc simulate``: ``<runs_dir>/<run>/model``)."""
    return Path(runs_dir) / run_id / "model"


def check_comparable(runs_dir: str | Path, run_a: Mapping[str, Any], run_b: Mapping[str, Any]):
    """ValueError naming the first reason ``run_a`` and ``run_b`` (store records,
    ``RunStore.run``) cannot be compared on the same test images here."""
    for run in (run_a, run_b):
        name = f"run {run['id']} ({run['algorithm']})"
        if run["algorithm"] == "evaluate":
            raise ValueError(f"{name} is an evaluation job: it trained no model")
        if run["status"] != "completed":
            raise ValueError(f"{name} is {run['status']}, not completed: it exported no model")
        if not (model_dir(runs_dir, run["id"]) / "model.pt").is_file():
            raise ValueError(f"{name} has no exported model at {model_dir(runs_dir, run['id'])}")
        if (run["config"] or {}).get("transport", "local") != "local":
            raise ValueError(
                f"{name} ran over {run['config']['transport']}: its test images are at its "
                "nodes, not here (score it there with `fed-auc evaluate --site`)"
            )
    differ = [
        f"{words} ({_difference(_value(run_a, key), _value(run_b, key))})"
        for key, words in SAME_SPLIT.items()
        if _value(run_a, key) != _value(run_b, key)
    ]
    if differ:
        raise ValueError(
            f"runs {run_a['id']} and {run_b['id']} did not run on the same sites and split: "
            + "; ".join(differ)
        )


def _value(run: Mapping[str, Any], key: str) -> Any:
    value = (run["config"] or {}).get(key)
    return sorted(value) if key == "hold_out" and value else value


def _difference(a: Any, b: Any) -> str:
    """``A vs B``; for the sites' data, the sites whose data differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        differ = sorted(s for s in a.keys() | b.keys() if a.get(s) != b.get(s))
        return "differ at " + ", ".join(differ)
    return f"{a!r} vs {b!r}"


def check_cards(
    cards: tuple[dict[str, Any], dict[str, Any]], run_ids: tuple[str, str], kind: str = "runs"
) -> None:
    """Both models must score the same labels for the same positive class (``kind``: what
    ``run_ids`` name, for the message)."""
    (a, b), (id_a, id_b) = cards, run_ids
    for what, get in (("labels", lambda c: list(c["label_names"])), ("positive class",
                      card_positive_class)):  # fmt: skip
        if get(a) != get(b):
            raise ValueError(
                f"{kind} {id_a} and {id_b} score different {what}: {get(a)} vs {get(b)}"
            )


def compare_models(
    models: tuple[DenseNetClassifier, DenseNetClassifier],
    cards: tuple[dict[str, Any], dict[str, Any]],
    sites: Mapping[str, Split],
    compute: Compute | None = None,
    level: float = 0.95,
) -> list[dict[str, Any]]:
    """Rows of ``fed_auc.store.comparisons``: per site (and ``pooled``, all sites' images
    together, last) and label, model A's AUC minus model B's on the same images, paired."""
    compute = compute or Compute(torch.device("cpu"))
    scored = [
        score_sites(model, dict(sites), check_tta(card.get("tta", "none")), compute)
        for model, card in zip(models, cards, strict=True)
    ]
    names = list(cards[0]["label_names"])
    positive = card_positive_class(cards[0])
    per_site = {site: (scored[0][site][0], scored[0][site][1], scored[1][site][1])
                for site in sorted(sites)}  # fmt: skip
    if len(per_site) > 1:
        per_site[POOLED] = tuple(np.concatenate(p) for p in zip(*per_site.values(), strict=True))
    rows = []
    for site, (labels, a, b) in per_site.items():
        for j, result in enumerate(paired_auc_differences(labels, a, b, level)):
            rows.append({"site": site, "label": names[j], "positive_class": positive[j],
                         **asdict(result)})  # fmt: skip
    return rows
