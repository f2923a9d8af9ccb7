"""The run of a federated evaluation job: an evaluation, whatever transport reaches the sites.

``fed-auc evaluate --federation`` creates the run (``fed_auc.evaluate.job.new_evaluation_run``);
the coordinator then asks every site that joins to score the registered model
(``evaluate_at_sites``): the sites' data cards recorded, their reports combined
(``fed_auc.evaluate.job``), written and recorded, the run completed, or failed with why.
Only the message plumbing is the transport's (over Flower:
``fed_auc.transport.flower.evaluation``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fed_auc.data.cards import data_record
from fed_auc.evaluate.job import record_and_write, run_job, trained_sites
from fed_auc.exchange import EvaluationRequest, Transport
from fed_auc.store.run_store import RunStore


def evaluate_at_sites(
    store: RunStore,
    run_id: str,
    job: dict[str, Any],
    transport: Transport,
    model: tuple[EvaluationRequest, dict[str, torch.Tensor], dict[str, Any]],
    transport_name: str,
    log: Callable[[str], None] = print,
    record: Callable[[list[str]], dict[str, Any]] = lambda sites: {},
) -> dict[str, Any]:
    """Score ``job["model"]`` (``model``: its request, tensors and card) at every site that
    registers with ``transport`` (``transport_name`` in the results); record and write the
    results, complete the run (the store is closed after) and return the summary the
    coordinator prints. ``record(sites)``: more to record with the run's config once its
    sites are known (their keys)."""
    request, tensors, card = model
    with store.failure_recorded(run_id):
        sites = list(transport.register())
        store.record_sites(run_id, transport.summaries)
        # what the job really scored: the registered sites' data (data_record)
        summaries = [transport.summaries[s] for s in sites]
        store.update_config(
            run_id,
            {
                **store.run(run_id)["config"],
                **data_record(summaries, site_files=True),
                **record(sites),
            },
        )
        held_out = [s for s in sites if s not in trained_sites(card)]
        store.add_event(run_id, f"evaluation job of {job['model']} at {sites}; "
                        f"not trained on: {held_out}")  # fmt: skip
        log(f"evaluation {run_id}: sites {sites}; asking each for its report")
        results = run_job(transport, sites, request, tensors, held_out)
        summary = record_and_write(
            store, run_id, results, job["model"], card, transport_name, job["out"]
        )
        summary["run_id"] = run_id
        for site, reason in summary["failures"].items():
            log(f"evaluation {run_id}: site {site} did not report: {reason}")
        store.add_event(run_id, "evaluation completed")
        store.finish_run(run_id, "completed", summary)
        store.close()
    return summary
