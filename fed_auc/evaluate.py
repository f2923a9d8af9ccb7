"""Batch evaluation of a registered model: per site and pooled, per label, with uncertainty.

For every site (and all sites pooled) and every label: n, positives, prevalence, AUC with a
percentile-bootstrap 95 % CI, ROC points, binned score counts, and at the model card's
operating threshold sensitivity / specificity / PPV / NPV with Wilson CIs, sensitivity at 90 %
and 95 % specificity and the Brier score (``fed_auc.operating_point``); plus the worst-site
AUC. A site with one class gets the explicit "AUC undefined: no positives" (or negatives)
instead of a number. Writes JSON, CSV and a ROC plot. Models load only from the registry
format (`fed_auc.export.MODEL_FORMAT`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import roc_curve

from fed_auc.data.base import SiteData, Split
from fed_auc.data.labels import positive_classes
from fed_auc.export import MODEL_FORMAT
from fed_auc.io import save_json
from fed_auc.metrics import auc_of
from fed_auc.models import DenseNetClassifier, model_from_config
from fed_auc.operating_point import ScoreBins, default_edges, figures, reliability, score_bins
from fed_auc.pooled_auc import binned_aucs, percentile_interval, pooled_from_bins
from fed_auc.roc import roc_points
from fed_auc.tta import check_tta, predict

POOLED = "pooled"
BOOTSTRAP_CHUNK = 200  # resamples scored at once (memory: 200 × n counts)


def youden_threshold(labels: np.ndarray, scores: np.ndarray) -> float:
    """Score threshold maximising sensitivity + specificity − 1 (0.5 with one class)."""
    known = ~np.isnan(labels)
    y, s = labels[known].astype(int), scores[known]
    if len(y) == 0 or y.min() == y.max():
        return 0.5
    fpr, tpr, thresholds = roc_curve(y, s)
    return float(min(thresholds[int(np.argmax(tpr - fpr))], 1.0))


def load_registered_model(path: str | Path) -> tuple[DenseNetClassifier, dict[str, Any]]:
    """The network and card of a ``model.pt`` (or a folder holding one); anything that is not
    the registry format is refused with the reason."""
    path = Path(path)
    file = path / "model.pt" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"model {path}: no model.pt found (expected a {MODEL_FORMAT} file)")
    try:
        blob = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for foreign or corrupt files
        raise ValueError(
            f"model {file}: not a {MODEL_FORMAT} file ({type(exc).__name__}: {exc})"
        ) from None
    found = blob.get("format") if isinstance(blob, dict) else type(blob).__name__
    if found != MODEL_FORMAT:
        raise ValueError(
            f"model {file}: format {found!r}; fed-auc evaluate loads only {MODEL_FORMAT} "
            "(what `fed-auc simulate` exports to <run>/model/model.pt)"
        )
    model = model_from_config(blob["model_config"])
    model.load_state_dict(blob["state_dict"])
    card_file = file.parent / "model_card.json"
    card = json.loads(card_file.read_text()) if card_file.is_file() else {}
    card.setdefault("label_names", blob["label_names"])
    return model.eval(), card


def bootstrap_ci(
    labels: np.ndarray, scores: np.ndarray, n_boot: int, seed: int = 0, level: float = 0.95
) -> tuple[float | None, float | None]:
    """Percentile bootstrap CI of the AUC (resamples with one class are skipped).

    Each resample's AUC is the Mann–Whitney count over the distinct scores (ties count ½, as
    in sklearn's ``roc_auc_score``), for ``BOOTSTRAP_CHUNK`` resamples at once: a node's
    bootstrap costs milliseconds, not one sklearn call per resample."""
    if n_boot <= 0:
        return None, None
    labels = np.asarray(labels).astype(int)
    _, tie = np.unique(np.asarray(scores), return_inverse=True)
    n, distinct = len(labels), int(tie.max()) + 1 if len(labels) else 0
    rng = np.random.default_rng(seed)
    values = []
    for start in range(0, n_boot, BOOTSTRAP_CHUNK):
        k = min(BOOTSTRAP_CHUNK, n_boot - start)
        idx = rng.integers(0, n, (k, n))
        cells = tie[idx] + distinct * labels[idx] + 2 * distinct * np.arange(k)[:, None]
        counts = np.bincount(cells.ravel(), minlength=2 * distinct * k).reshape(k, 2, distinct)
        values.append(binned_aucs(counts[:, 1].astype(float), counts[:, 0].astype(float)))
    return percentile_interval(np.concatenate(values), level)


def calibration_rows(bins: ScoreBins) -> list[dict[str, Any]]:
    """The reliability diagram of ``bins`` as JSON rows (observed rate with its Wilson CI)."""
    return [
        {"lo": c.lo, "hi": c.hi, "n": c.n, "mean_score": c.mean_score,
         "observed": c.observed.value, "observed_lo": c.observed.lo, "observed_hi": c.observed.hi}
        for c in reliability(bins)
    ]  # fmt: skip


def label_result(
    labels: np.ndarray, scores: np.ndarray, threshold: float, n_boot: int, seed: int
) -> dict[str, Any]:
    """Everything reported for one label on one site."""
    known = ~np.isnan(labels)
    y, s = labels[known].astype(int), scores[known]
    result = auc_of(labels, scores)
    positives = int(y.sum())
    out: dict[str, Any] = {
        "n": int(len(y)),
        "positives": positives,
        "prevalence": positives / len(y) if len(y) else None,
        "auc": result.auc,
        "ci_lo": None,
        "ci_hi": None,
        "note": result.reason,
        "threshold": threshold,
        "sensitivity": float((s[y == 1] >= threshold).mean()) if positives else None,
        "specificity": float((s[y == 0] < threshold).mean()) if len(y) > positives else None,
        "roc": None,
    }
    bins = score_bins(y, s, default_edges([threshold]))
    if threshold < 1.0:  # "score ≥ 1" is no operating point the bins can resolve
        clinical = figures(bins, threshold)
        out.update({k: v for k, v in clinical.items() if k not in out})
    out["calibration"] = calibration_rows(bins)
    out["bins"] = bins.to_dict()
    if result.auc is not None:
        out["ci_lo"], out["ci_hi"] = bootstrap_ci(y, s, n_boot, seed)
        points = roc_points(y.astype(float), s)  # ≤ 101 points: what a node may send
        out["roc"] = {"fpr": points["fpr"], "tpr": points["tpr"], "threshold": points["thresholds"]}
    return out


def evaluate_model(
    model: DenseNetClassifier,
    card: dict[str, Any],
    sites: dict[str, Split],
    n_boot: int = 1000,
    seed: int = 0,
    tta: str | None = None,
) -> dict[str, Any]:
    """Per-site and pooled results for every label; `sites` maps a name to its split.
    ``tta`` None scores as the model was selected: the card's mode (``none`` if absent)."""
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
    scored = {
        site: (split.labels.numpy(), predict(model, split.images, tta))
        for site, split in sites.items()
    }
    if len(scored) > 1:
        scored[POOLED] = tuple(
            np.concatenate(parts) for parts in zip(*scored.values(), strict=True)
        )
    results: dict[str, Any] = {"label_names": names, "positive_class": card_positive_class(card),
                               "bootstrap": n_boot, "tta": tta, "sites": {}}  # fmt: skip
    for site, (labels, scores) in scored.items():
        results["sites"][site] = {
            label: label_result(labels[:, j], scores[:, j], thresholds[j], n_boot, seed)
            for j, label in enumerate(names)
        }
    if len(sites) > 1:  # what a federation reports without pooling scores, for comparison
        results["pooled_from_bins"] = pooled_binned(results["sites"], names, n_boot, seed)
    results["worst_site_auc"] = worst_site_auc(results["sites"], names)
    return results


def pooled_binned(
    per_site: dict[str, Any], names: list[str], n_boot: int, seed: int
) -> dict[str, Any]:
    """Per label, the AUC of the sites' added-up score counts with its count-bootstrap CI and
    the binning's worst-case error (``fed_auc.pooled_auc``)."""
    out = {}
    for label in names:
        parts = {
            site: ScoreBins.from_dict(r[label]["bins"], f"site {site} label {label}")
            for site, r in per_site.items()
            if site != POOLED
        }
        out[label] = pooled_from_bins(parts, n_boot, seed)[1]
    return out


def worst_site_auc(per_site: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """Per label, the site with the lowest defined AUC (the pooled entry excluded)."""
    worst_of = {}
    for label in names:
        defined = {
            site: r[label]["auc"]
            for site, r in per_site.items()
            if site != POOLED and r[label]["auc"] is not None
        }
        worst = min(defined, key=defined.get) if defined else None
        worst_of[label] = (
            {"site": worst, "auc": defined[worst]} if worst else {"site": None, "auc": None}
        )
    return worst_of


def site_splits(sites: list[SiteData], split: str, by_site: bool) -> dict[str, Split]:
    """The split to score per site, or all sites' rows as one ``all`` site."""
    splits = {s.name: getattr(s, split) for s in sites}
    if by_site:
        return splits
    parts = list(splits.values())
    images = torch.cat([p.images for p in parts])
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
