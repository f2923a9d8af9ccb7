"""Batch evaluation at every site without data leaving: the federation's evaluation job.

A node scores a registered model on its own splits with the card's TTA and threshold and
answers, per label, what ``fed_auc.metrics.report.label_result`` reports locally: n, positives, AUC
with a seeded node-side bootstrap CI, ≤ 101 ROC points, the operating point at the threshold and
at 90/95 % specificity, calibration bins and binned score counts. Nothing per image leaves it.
The coordinator adds the pooled figures from the summed counts (``fed_auc.metrics.pooled``), names
every site that could not answer and why, writes the files local ``fed-auc evaluate`` writes,
and records the evaluation in the store. Local ``fed-auc evaluate --site`` records the same rows
(``record_local``). Sites the model was not trained on (not in its card: held out, or
external) are marked as such everywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fed_auc.data.base import SiteData
from fed_auc.evaluate.local import card_positive_class, write_results
from fed_auc.exchange import MODEL_FORMAT, EvaluationRequest, NodeFailure, Transport
from fed_auc.metrics.operating_point import ScoreBins, figures
from fed_auc.metrics.pooled import check_same_edges, pooled_from_bins, roc_from_bins
from fed_auc.metrics.report import POOLED, calibration_rows, worst_site_auc
from fed_auc.metrics.wording import BINNED_BOOTSTRAP, BOOTSTRAP, auc_text, class_text
from fed_auc.models import DenseNetClassifier
from fed_auc.registry.load import load_registered_model
from fed_auc.store.run_store import RunStore, git_revision
from fed_auc.tta import check_tta

SPLITS = ("test", "val")
EVALUATE = "evaluate"  # the store's algorithm of an evaluation run
POOLED_BINS = "bins"  # how a pooled entry was made: the sites' summed score counts (a job)
POOLED_SCORES = "scores"  # the sites' scores pooled where they were scored (local evaluate)


def model_request(
    path: str | Path, splits: list[str], bootstrap: int, seed: int
) -> tuple[EvaluationRequest, dict[str, torch.Tensor], dict[str, Any]]:
    """The request, the model's tensors and its card, for the model at ``path``."""
    bad = [s for s in splits if s not in SPLITS]
    if bad or not splits:
        raise ValueError(f"splits must be among {list(SPLITS)}, got {splits}")
    model, card = load_registered_model(path)
    return card_request(model, card, splits, bootstrap, seed), dict(model.state_dict()), card


def card_request(
    model: DenseNetClassifier, card: dict[str, Any], splits: list[str], bootstrap: int, seed: int
) -> EvaluationRequest:
    """The request that scores ``model`` as its ``card`` says (threshold, TTA) on ``splits``."""
    names = list(card["label_names"])
    return EvaluationRequest(
        MODEL_FORMAT,
        model.config(),
        names,
        [float(t) for t in card.get("threshold") or [0.5] * len(names)],
        check_tta(card.get("tta", "none")),
        list(splits),
        int(bootstrap),
        int(seed),
    )


def trained_sites(card: dict[str, Any]) -> set[str]:
    """The sites the model's card says it was trained on."""
    return {row["site"] for row in card.get("sites", [])}


def combine(
    answers: dict[str, dict[str, Any] | NodeFailure],
    request: EvaluationRequest,
    split: str,
    held_out: list[str],
) -> dict[str, Any]:
    """One split's results in the layout of local ``fed-auc evaluate``, plus the pooled entry
    from the summed counts, the sites that could not answer, and the held-out sites."""
    names = request.label_names
    reports = {s: a for s, a in answers.items() if not isinstance(a, NodeFailure)}
    per_site = {site: report["splits"][split] for site, report in reports.items()}
    results: dict[str, Any] = {
        "label_names": names,
        "bootstrap": request.bootstrap,
        "tta": request.tta,
        "split": split,
        "sites": dict(per_site),
        "held_out": sorted(held_out),
        "failures": {
            site: f"{a.status}: {a.message}"
            for site, a in answers.items()
            if isinstance(a, NodeFailure)
        },
    }
    if per_site:
        results["sites"][POOLED] = {
            label: pooled_entry(per_site, label, j, request) for j, label in enumerate(names)
        }
    results["worst_site_auc"] = worst_site_auc(results["sites"], names)
    return results


def pooled_entry(
    per_site: dict[str, Any], label: str, j: int, request: EvaluationRequest
) -> dict[str, Any]:
    """The pooled figures of one label from the sites' counts (no score was pooled)."""
    names = sorted(per_site)
    parts = [
        ScoreBins.from_dict(per_site[s][label]["bins"], f"site {s} label {label}") for s in names
    ]
    check_same_edges(parts, names)
    bins, pooled = pooled_from_bins(dict(zip(names, parts, strict=True)), request.bootstrap,
                                    request.seed)  # fmt: skip
    n, positives = bins.n_positive + bins.n_negative, bins.n_positive
    threshold = request.thresholds[j]
    out: dict[str, Any] = {
        "n": n,
        "positives": positives,
        "prevalence": positives / n if n else None,
        "auc": pooled["auc"],
        "ci_lo": pooled["ci_lo"],
        "ci_hi": pooled["ci_hi"],
        "auc_error_bound": pooled["auc_error_bound"],
        "note": _pooled_note(bins, names),
        "threshold": threshold,
        "roc": roc_from_bins(bins),
        "pooled_sites": names,
        "pooled_from": POOLED_BINS,
    }
    if threshold < 1.0:  # as local evaluate: "score ≥ 1" is no point the bins resolve
        out.update({k: v for k, v in figures(bins, threshold).items() if k not in out})
    out.setdefault("sensitivity", None)
    out.setdefault("specificity", None)
    out["calibration"] = calibration_rows(bins)
    out["bins"] = bins.to_dict()
    return out


def _pooled_note(bins: ScoreBins, sites: list[str]) -> str:
    if bins.n_positive == 0 or bins.n_negative == 0:
        return f"AUC undefined: no {'positives' if bins.n_positive == 0 else 'negatives'}"
    return f"pooled from the binned score counts of {', '.join(sites)}"


def run_job(
    transport: Transport,
    sites: list[str],
    request: EvaluationRequest,
    tensors: dict[str, torch.Tensor],
    held_out: list[str],
) -> dict[str, dict[str, Any]]:
    """Ask every site for its report and combine them: split → results."""
    answers = transport.report(sites, request, tensors)
    return {split: combine(answers, request, split, held_out) for split in request.splits}


def record_and_write(
    store: RunStore,
    run_id: str,
    results: dict[str, dict[str, Any]],
    model: str,
    card: dict[str, Any],
    transport_name: str,
    out_dir: str | Path,
) -> dict[str, Any]:
    """Record every split in the store, write ``evaluation.json`` / ``.csv`` / ``roc.png``
    (test in ``out_dir``, validation in ``out_dir/val``), return the files and per-site AUCs."""
    summary = record_job(store, run_id, results, model, card, transport_name)
    for split, result in results.items():
        folder = Path(out_dir) if split == "test" else Path(out_dir) / split
        summary["files"][split] = {k: str(v) for k, v in write_results(result, folder).items()}
    return summary


def record_job(
    store: RunStore,
    run_id: str,
    results: dict[str, dict[str, Any]],
    model: str,
    card: dict[str, Any],
    transport_name: str,
) -> dict[str, Any]:
    """Record every split (and a warning event per site that did not report); returns the
    job's summary without its files: per-site AUCs, failures, held-out sites."""
    summary: dict[str, Any] = {"files": {}, "auc": {}, "failures": {}}
    for split, result in results.items():
        result.update(model=model, model_run_id=card.get("run_id"), transport=transport_name)
        result.setdefault("positive_class", card_positive_class(card))
        store.record_evaluation(run_id, split, result)
        summary["auc"][split] = {
            site: [labels[name]["auc"] for name in result["label_names"]]
            for site, labels in result["sites"].items()
        }
        summary["failures"] = result["failures"]
    for site, reason in summary["failures"].items():
        store.add_event(
            run_id, f"evaluation: site {site} did not report: {reason}", "warning", site
        )
    summary["held_out"] = next(iter(results.values()))["held_out"]
    return summary


def new_evaluation_run(store: RunStore, record: dict[str, Any]) -> str:
    """A new evaluation run in the store: the one way an evaluation job's run is created,
    local (``record_local``) or federated (``fed-auc evaluate --federation``)."""
    return store.create_run(EVALUATE, record, git_revision())


def record_local(
    runs_dir: str | Path,
    results: dict[str, Any],
    request: EvaluationRequest,
    card: dict[str, Any],
    model: str | Path,
    sites: dict[str, SiteData],
    files: dict[str, str],
) -> str:
    """Record ``evaluate_model``'s ``results`` (one split of the data ``sites``, scored here) as
    an evaluation run with the rows the job records for the same model and sites: the sites'
    reports combined as the job combines them, except the pooled entry: the scores met here,
    so it is the per-image pooled AUC and bootstrap CI the console printed (``pooled_from``
    ``scores``), not the binned counts' approximation. Returns the run id."""
    from fed_auc.data.cards import data_record, site_summary

    model = str(Path(model).resolve())
    (split,) = request.splits
    held_out = sorted(s for s in sites if s not in trained_sites(card))
    answers = {
        site: {"splits": {split: labels}}
        for site, labels in results["sites"].items()
        if site != POOLED  # per-image pooling: local only, nothing the job can record
    }
    job = {"model": model, "splits": [split], "bootstrap": request.bootstrap,
           "seed": request.seed, "out": str(Path(files["json"]).parent.resolve())}  # fmt: skip
    with RunStore(runs_dir) as store:
        summaries = {name: site_summary(d) for name, d in sites.items()}
        record = data_record(list(summaries.values()), site_files=True)  # what it scored
        run_id = new_evaluation_run(store, {"evaluation": job, "transport": "local", **record})
        with store.failure_recorded(run_id):
            store.record_sites(run_id, summaries)
            store.add_event(run_id, f"evaluation job of {model} at {list(sites)}; "
                            f"not trained on: {held_out}")  # fmt: skip
            combined = {split: combine(answers, request, split, held_out)}
            pooled = results["sites"].get(POOLED)
            if pooled is not None:  # the scores met here: the pooled AUC the console printed
                combined[split]["sites"][POOLED] = {
                    label: {**r, "pooled_sites": sorted(answers), "pooled_from": POOLED_SCORES}
                    for label, r in pooled.items()
                }
            summary = record_job(store, run_id, combined, model, card, "local")
            summary.update(files={split: files}, run_id=run_id)
            store.add_event(run_id, "evaluation completed")
            store.finish_run(run_id, "completed", summary)
    return run_id


def describe(results: dict[str, Any]) -> list[str]:
    """One line per site and label (and per site that did not report), for the CLI: each AUC
    with its interval's method and the positive class (``fed_auc.metrics.wording``)."""
    positive = results.get("positive_class") or [None] * len(results["label_names"])
    split = results.get("split", "test")
    lines = []
    for site, labels in results["sites"].items():
        mark = " (held out)" if site in results.get("held_out", []) else ""
        for (label, r), named in zip(labels.items(), positive, strict=True):
            lines.append(
                f"{site + mark:<24} {label:<18} {split} n {r['n']:<5} {result_text(r, named)}"
            )
    for site, reason in results.get("failures", {}).items():
        lines.append(f"{site:<24} did not report: {reason}")
    return lines


def result_text(result: dict[str, Any], positive_class: str | None) -> str:
    """One label's AUC with its interval and method, or why it is undefined; then the class.
    A pooled entry of summed counts carries ``auc_error_bound``: its interval is a bootstrap
    of the counts, its AUC exact within that bound."""
    method = BOOTSTRAP
    if result.get("auc_error_bound") is not None:
        method = f"{BINNED_BOOTSTRAP}, binning error ≤ {result['auc_error_bound']:.4f}"
    why = result["note"].removeprefix("AUC ") or "undefined"  # "undefined: no positives"
    return auc_text(
        result["auc"], result["ci_lo"], result["ci_hi"], method, class_text(positive_class), why
    )


def label_lines(labels: dict[str, dict[str, Any]], positive_class: list[str | None]) -> str:
    """A site's labels on one line: ``result_text`` each, named by label where there are
    several."""
    texts = [result_text(r, p) for r, p in zip(labels.values(), positive_class, strict=True)]
    if len(texts) == 1:
        return texts[0]
    return "; ".join(f"{label}: {text}" for label, text in zip(labels, texts, strict=True))
