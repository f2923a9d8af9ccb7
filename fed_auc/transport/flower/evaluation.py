"""An evaluation-only Flower run: the coordinator asks every node to score a registered model.

Started like a training run (``fed-auc evaluate --federation CONFIG``: the experiment TOML with
its ``[flower]`` table), through the same SuperLink, nodes and store, with no training round.
The nodes load their data as the model's training run did (the card's image size and seed, so a
site's own test split is the one the card reports on) and answer the job of
``fed_auc.evaluate.job``; a node that errs or misses ``eval_timeout_s`` is recorded by name
and reason, and the others still report.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fed_auc.data.cards import data_record
from fed_auc.evaluate.job import model_request, record_and_write, run_job, trained_sites
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.experiment.files import FlowerSettings
from fed_auc.run.lifecycle import fail_run
from fed_auc.store.run_store import RunStore
from fed_auc.transport.flower.identity import SiteIdentities
from fed_auc.transport.flower.transport import FlowerTransport


def job_config(config: ExperimentConfig, card: dict[str, Any]) -> ExperimentConfig:
    """The experiment with the card's image size and seed: the nodes then load and split their
    data exactly as they did for the training run. (Scoring uses the card's TTA, so the
    data-kind defaults, which concern training, are settled as for image files.)"""
    config = dataclasses.replace(config, image_size=card["image_size"], seed=card["seed"])
    return config.with_data_kind(False)


def run_evaluation(
    grid, experiment: dict[str, Any], log=print, make_transport=FlowerTransport
) -> dict[str, Any]:
    """Score ``experiment["evaluation"]["model"]`` at every site that joins; record and write
    the results; return the summary the coordinator prints."""
    job = experiment["evaluation"]
    settings = FlowerSettings(**experiment["flower"])
    run_id = experiment["run_id"]
    config = ExperimentConfig(**experiment["experiment"])
    store = RunStore(config.runs_dir)

    def event(site: str | None, level: str, message: str) -> None:
        store.add_event(run_id, message, level, site)

    try:
        request, tensors, card = model_request(
            job["model"], job["splits"], job["bootstrap"], job["seed"]
        )
        config = job_config(config, card)
        setup = config.node_setup(
            run_id, request.model_config, len(request.label_names), settings.expected_sites
        )
        recorded = store.run(run_id)["config"]
        identities = SiteIdentities.for_run(experiment, recorded, run_id)
        transport = make_transport(grid, setup, settings, log, event, identities)
        log(f"evaluation {run_id}: waiting for {settings.expected_sites} site(s)")
        sites = list(transport.register())
        store.record_sites(run_id, transport.summaries)
        # what the job really scored: the registered sites' data (data_record)
        summaries = [transport.summaries[s] for s in sites]
        store.update_config(
            run_id,
            {
                **recorded,
                **data_record(summaries, site_files=True),
                **identities.record(sites),
            },
        )
        held_out = [s for s in sites if s not in trained_sites(card)]
        store.add_event(run_id, f"evaluation job of {job['model']} at {sites}; "
                        f"not trained on: {held_out}")  # fmt: skip
        log(f"evaluation {run_id}: sites {sites}; asking each for its report")
        results = run_job(transport, sites, request, tensors, held_out)
        summary = record_and_write(store, run_id, results, job["model"], card, "flower", job["out"])
        summary["run_id"] = run_id
        for site, reason in summary["failures"].items():
            log(f"evaluation {run_id}: site {site} did not report: {reason}")
        store.add_event(run_id, "evaluation completed")
        store.finish_run(run_id, "completed", summary)
        store.close()
    except BaseException as exc:
        fail_run(store, run_id, exc)
        raise
    transport.end("completed")  # the nodes say so, not that the coordinator is gone
    return summary
