"""Two registered models compared where the images are: every node of a federation scores both
on its own test split and answers per label only their paired AUC difference
(``fed_auc.node.compare``). The coordinator records one row per site and label in the store's
``comparisons`` table, the rows ``fed-auc runs --compare`` records for in-process runs.

No pooled row: the images never meet, so no AUC over all sites' images exists. Where more
than one site reported, one row per label named ``combined (fixed effect)`` gives the
inverse-variance weighted mean of the sites' differences with its interval
(``fed_auc.metrics.paired.fixed_effect``): an estimate of a common difference, not a pooled AUC.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from fed_auc.data.cards import data_record
from fed_auc.evaluate.compare import SPLIT, check_cards
from fed_auc.evaluate.job import model_request
from fed_auc.evaluate.local import card_positive_class
from fed_auc.exchange import ComparisonRequest, NodeFailure, Transport
from fed_auc.metrics.paired import DELONG, FIXED_EFFECT, PairedDifference, fixed_effect
from fed_auc.store.run_store import RunStore

Pair = tuple[ComparisonRequest, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]],
             tuple[dict[str, Any], dict[str, Any]]]  # fmt: skip
COMPARISON_FILE = "comparison.json"


def comparison_request(path_a: str | Path, path_b: str | Path, level: float = 0.95) -> Pair:
    """The request, both models' tensors and both cards. Refused (ValueError) unless both
    score the same labels for the same positive class, and their nodes would load the same
    test images for both (the same image size and seed, which splits a site without a split
    column)."""
    request_a, tensors_a, card_a = model_request(path_a, [SPLIT], 0, 0)
    request_b, tensors_b, card_b = model_request(path_b, [SPLIT], 0, 0)
    names = (f"A ({path_a})", f"B ({path_b})")
    check_cards((card_a, card_b), names, "models")
    for key, why in (("image_size", "image size"), ("seed", "seed (it splits a site's data)")):
        if card_a.get(key) != card_b.get(key):
            raise ValueError(
                f"models {names[0]} and {names[1]} were trained with another {why}: "
                f"{card_a.get(key)!r} vs {card_b.get(key)!r}; their nodes would not score "
                "both on the same test images"
            )
    request = ComparisonRequest(request_a, request_b, level)
    return request, (tensors_a, tensors_b), (card_a, card_b)


def model_run(card: Mapping[str, Any], path: str) -> dict[str, Any]:
    """How the comparison names a model: its training run (its card's), else its path."""
    return {"id": card.get("run_id") or str(path), "algorithm": card.get("algorithm", "model")}


def comparison_rows(
    answers: Mapping[str, dict[str, Any] | NodeFailure], request: ComparisonRequest,
    positive: list[str | None],
) -> tuple[list[dict[str, Any]], dict[str, str]]:  # fmt: skip
    """Rows of ``fed_auc.store.comparisons`` per site and label (the combined rows last), and
    the sites that did not answer, with why."""
    failures = {s: f"{a.status}: {a.message}" for s, a in answers.items()
                if isinstance(a, NodeFailure)}  # fmt: skip
    reported = sorted(s for s in answers if s not in failures)
    names = request.a.label_names
    per_site: dict[str, list[PairedDifference]] = {}
    rows = []
    for site in reported:
        results = answers[site]["splits"][SPLIT]
        if [r["label"] for r in results] != names:
            failures[site] = f"error: answered labels {[r['label'] for r in results]}, not {names}"
            continue
        per_site[site] = [_difference(r) for r in results]
        rows += [_row(site, names[j], positive[j], d) for j, d in enumerate(per_site[site])]
    if len(per_site) > 1:
        for j, name in enumerate(names):
            combined = fixed_effect({s: d[j] for s, d in per_site.items()}, request.level)
            rows.append(_row(FIXED_EFFECT, name, positive[j], combined))
    return rows, failures


def _difference(values: Mapping[str, Any]) -> PairedDifference:
    fields = PairedDifference.__dataclass_fields__
    return PairedDifference(**{k: v for k, v in values.items() if k in fields})


def _row(site: str, label: str, positive: str | None, d: PairedDifference) -> dict[str, Any]:
    return {"site": site, "label": label, "positive_class": positive, **asdict(d)}


def compare_at_sites(
    store: RunStore,
    run_id: str,
    job: dict[str, Any],
    transport: Transport,
    pair: Pair,
    transport_name: str,
    log: Callable[[str], None] = print,
    record: Callable[[list[str]], dict[str, Any]] = lambda sites: {},
) -> dict[str, Any]:
    """Compare ``job["model"]`` (A) with ``job["compare_to"]`` (B) at every site that
    registers with ``transport``: record the rows under the two models' runs, write
    ``comparison.json`` to ``job["out"]``, complete the evaluation run (the store is closed
    after) and return the summary: ``comparison`` (what ``fed_auc.cli.compare`` prints)."""
    request, tensors, cards = pair
    with store.failure_recorded(run_id):
        sites = list(transport.register())
        store.record_sites(run_id, transport.summaries)
        summaries = [transport.summaries[s] for s in sites]
        config = store.run(run_id)["config"]
        store.update_config(run_id, {**config, **data_record(summaries, site_files=True),
                                     **record(sites)})  # fmt: skip
        store.add_event(run_id, f"comparison of {job['model']} (A) with {job['compare_to']} "
                        f"(B) at {sites}")  # fmt: skip
        log(f"comparison {run_id}: sites {sites}; asking each to score both models")
        answers = transport.compare(sites, request, tensors)
        positive = card_positive_class(cards[0])
        rows, failures = comparison_rows(answers, request, positive)
        run_a, run_b = (model_run(c, job[k]) for c, k in zip(cards, ("model", "compare_to"),
                                                             strict=True))  # fmt: skip
        store.record_comparison(run_a["id"], run_b["id"], SPLIT, rows)
        for site, reason in failures.items():
            log(f"comparison {run_id}: site {site} did not answer: {reason}")
            store.add_event(run_id, f"comparison: site {site} did not answer: {reason}",
                            "warning", site)  # fmt: skip
        about = {
            "run_a": run_a, "run_b": run_b, "split": SPLIT,
            "sites": sorted({r["site"] for r in rows} - {FIXED_EFFECT}),
            "label_names": list(request.a.label_names), "positive_class": positive,
            "method": DELONG, "level": request.level, "transport": transport_name,
            "failures": failures,
        }  # fmt: skip
        comparison = {**about, "rows": rows}
        out = Path(job["out"])
        out.mkdir(parents=True, exist_ok=True)
        (out / COMPARISON_FILE).write_text(json.dumps(comparison, indent=2))
        summary = {"run_id": run_id, "comparison": comparison, "failures": failures,
                   "files": {SPLIT: {"json": str(out / COMPARISON_FILE)}}}  # fmt: skip
        store.add_event(run_id, "comparison completed")
        store.finish_run(run_id, "completed", summary)
        store.close()
    return summary
