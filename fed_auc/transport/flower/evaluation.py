"""An evaluation-only Flower run's plumbing: the nodes' setup and transport for the job whose
run is an evaluation's (``fed_auc.evaluate.federated``).

Started like a training run (``fed-auc evaluate --federation CONFIG``: the experiment TOML with
its ``[flower]`` table), through the same SuperLink, nodes and store, with no training round.
The nodes load their data as the model's training run did (the card's image size and seed, so a
site's own test split is the one the card reports on) and answer the job of
``fed_auc.evaluate.job`` (with ``compare_to``: both models, compared per site by
``fed_auc.evaluate.federated_compare``); a node that errs or misses ``eval_timeout_s`` is
recorded by name and reason, and the others still report.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fed_auc.evaluate.federated import evaluate_at_sites
from fed_auc.evaluate.federated_compare import compare_at_sites, comparison_request
from fed_auc.evaluate.job import model_request
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.experiment.files import FlowerSettings
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
    """Score ``experiment["evaluation"]["model"]`` at every site that joins
    (``fed_auc.evaluate.federated.evaluate_at_sites``), or compare it with its ``compare_to``
    (``fed_auc.evaluate.federated_compare.compare_at_sites``); return the summary the coordinator
    prints."""
    job = experiment["evaluation"]
    settings = FlowerSettings(**experiment["flower"])
    run_id = experiment["run_id"]
    config = ExperimentConfig(**experiment["experiment"])
    store = RunStore(config.runs_dir)

    def event(site: str | None, level: str, message: str) -> None:
        store.add_event(run_id, message, level, site)

    comparing = job.get("compare_to") is not None
    with store.failure_recorded(run_id):
        if comparing:  # two models, each scored as an evaluation of it would (test split)
            pair = comparison_request(job["model"], job["compare_to"])
            request, card = pair[0].a, pair[2][0]
        else:
            model = model_request(job["model"], job["splits"], job["bootstrap"], job["seed"])
            request, card = model[0], model[2]
        config = job_config(config, card)
        setup = config.node_setup(
            run_id, request.model_config, len(request.label_names), settings.expected_sites
        )
        identities = SiteIdentities.for_run(experiment, store.run(run_id)["config"], run_id)
        transport = make_transport(grid, setup, settings, log, event, identities)
    log(f"evaluation {run_id}: waiting for {settings.expected_sites} site(s)")
    if comparing:
        summary = compare_at_sites(
            store, run_id, job, transport, pair, "flower", log, identities.record
        )
    else:
        summary = evaluate_at_sites(
            store, run_id, job, transport, model, "flower", log, identities.record
        )
    transport.end("completed")  # the nodes say so, not that the coordinator is gone
    return summary
