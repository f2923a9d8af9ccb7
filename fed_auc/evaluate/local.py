"""Batch evaluation of a registered model: per site and pooled, per label, with uncertainty.

For every site (and all sites pooled) and every label: n, positives, prevalence, AUC with a
percentile-bootstrap 95 % CI, ROC points, binned score counts, and at the model card's
operating threshold sensitivity / specificity / PPV / NPV with Wilson CIs, sensitivity at 90 %
and 95 % specificity and the Brier score (``fed_auc.metrics.operating_point``); plus the worst-site
AUC. A site with one class gets the explicit "AUC undefined: no positives" (or negatives)
instead of a number. Writes JSON, CSV and a ROC plot. Models load only from the registry
format (`fed_auc.exchange.MODEL_FORMAT`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from fed_auc.data.base import SiteData, Split
from fed_auc.data.labels import positive_classes
from fed_auc.data.memmap import gather
from fed_auc.io import save_json
from fed_auc.metrics.operating_point import (
    ScoreBins,
)
from fed_auc.metrics.pooled import pooled_from_bins
from fed_auc.metrics.report import POOLED, label_result, worst_site_auc
from fed_auc.models import DenseNetClassifier
from fed_auc.node.compute import Compute
from fed_auc.tta import check_tta, predict


def evaluate_model(
    model: DenseNetClassifier,
    card: dict[str, Any],
    sites: dict[str, Split],
    n_boot: int = 1000,
    seed: int = 0,
    tta: str | None = None,
    compute: Compute | None = None,
) -> dict[str, Any]:
    """Per-site and pooled results for every label; `sites` maps a name to its split.
    ``tta`` None scores as the model was selected: the card's mode (``none`` if absent).
    ``compute``: the device and precision that score (None: fp32 on the CPU)."""
    names = card["label_names"]
    tta = check_tta(card.get("tta", "none") if tta is None else tta)
    num = len(names)
    if model.num_labels != num:
        raise ValueError(f"model has {model.num_labels} outputs, its card {num} labels")
    for site, split in sites.items():
        if split.num_labels != num:
            raise ValueError(
                f"site {site}: data has {split.num_labels} label(s), the model {num} ({names})"
            )
    thresholds = list(card.get("threshold") or [0.5] * num)
    compute = compute or Compute(torch.device("cpu"))
    scored = score_sites(model, sites, tta, compute)
    if len(scored) > 1:
        scored[POOLED] = tuple(
            np.concatenate(parts) for parts in zip(*scored.values(), strict=True)
        )
    results: dict[str, Any] = {"label_names": names, "positive_class": card_positive_class(card),
                               "bootstrap": n_boot, "tta": tta, **compute.describe(),
                               "sites": {}}  # fmt: skip
    for site, (labels, scores) in scored.items():
        results["sites"][site] = {
            label: label_result(labels[:, j], scores[:, j], thresholds[j], n_boot, seed)
            for j, label in enumerate(names)
        }
    if len(sites) > 1:  # what a federation reports without pooling scores, for comparison
        results["pooled_from_bins"] = pooled_binned(results["sites"], names, n_boot, seed)
    results["worst_site_auc"] = worst_site_auc(results["sites"], names)
    return results


def score_sites(
    model: DenseNetClassifier, sites: dict[str, Split], tta: str, compute: Compute
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per site, its (N, L) labels and the model's (N, L) scores with ``tta``: the one way a
    registered model is scored here (``evaluate_model``, ``fed_auc.evaluate.compare``)."""
    model.to(compute.device)
    with compute.autocast():
        return {
            site: (split.labels.numpy(), predict(model, split.images, tta))
            for site, split in sites.items()
        }


def pooled_binned(
    per_site: dict[str, Any], names: list[str], n_boot: int, seed: int
) -> dict[str, Any]:
    """Per label, the AUC of the sites' added-up score counts with its count-bootstrap CI and
    the binning's worst-case error (``fed_auc.metrics.pooled``)."""
    out = {}
    for label in names:
        parts = {
            site: ScoreBins.from_dict(r[label]["bins"], f"site {site} label {label}")
            for site, r in per_site.items()
            if site != POOLED
        }
        out[label] = pooled_from_bins(parts, n_boot, seed)[1]
    return out


def site_splits(sites: list[SiteData], split: str, by_site: bool) -> dict[str, Split]:
    """The split to score per site, or all sites' rows as one ``all`` site."""
    splits = {s.name: getattr(s, split) for s in sites}
    if by_site:
        return splits
    parts = list(splits.values())
    images = torch.cat([gather(p.images) for p in parts])  # one split, in memory
    return {"all": Split(images, torch.cat([p.labels for p in parts]))}


def card_positive_class(card: dict[str, Any]) -> list[str]:
    """The class a model's numbers are about: its card's, or derived from its label names
    (cards written before the card named it)."""
    return card.get("positive_class") or positive_classes(list(card["label_names"]))


def results_table(results: dict[str, Any]) -> pd.DataFrame:
    """One row per site and label (no ROC points), each naming its positive class."""
    named = dict(zip(results["label_names"], results.get("positive_class") or [], strict=False))
    rows = [
        {
            "site": site,
            "label": label,
            "positive_class": named.get(label),
            **{k: v for k, v in r.items() if k not in ("roc", "bins", "calibration")},
        }
        for site, labels in results["sites"].items()
        for label, r in labels.items()
    ]
    return pd.DataFrame(rows)


def plot_roc(results: dict[str, Any], path: Path) -> None:
    """One panel per label, one curve per site (pooled dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = results["label_names"]
    named = dict(zip(names, results.get("positive_class") or [], strict=False))
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 4), squeeze=False)
    for ax, label in zip(axes[0], names, strict=True):
        for site, labels in results["sites"].items():
            r = labels[label]
            if r["roc"] is None:
                continue
            style = "--" if site == POOLED else "-"
            ax.plot(r["roc"]["fpr"], r["roc"]["tpr"], style, label=f"{site} {r['auc']:.3f}")
        ax.plot([0, 1], [0, 1], ":", color="grey")
        title = f"{label}: positive class {named[label]}" if label in named else label
        ax.set(title=title, xlabel="1 − specificity", ylabel="sensitivity")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="lower right")
        else:
            ax.text(0.5, 0.5, "AUC undefined at every site", ha="center")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_results(results: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """``evaluation.json``, ``evaluation.csv`` and ``roc.png`` in `out_dir`."""
    out_dir = Path(out_dir)
    paths = {
        "json": out_dir / "evaluation.json",
        "csv": out_dir / "evaluation.csv",
        "roc": out_dir / "roc.png",
    }
    save_json(results, paths["json"])
    results_table(results).to_csv(paths["csv"], index=False)
    plot_roc(results, paths["roc"])
    return paths
