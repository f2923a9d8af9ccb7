"""The Flower ServerApp: fed-auc's coordinator driving nodes through Flower messages.

``run_experiment`` is ``run_simulation``'s short function into the run frame
(``fed_auc.run.frame.run_federation``), with the sites behind ``FlowerTransport``
(``fed_auc.transport.flower.transport``) instead of in-process.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fed_auc.coordinator.errors import FederationError
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.experiment.files import FlowerSettings
from fed_auc.metrics.wording import auc_text, class_text
from fed_auc.models import build_model
from fed_auc.node.setup import NodeSetup
from fed_auc.run.frame import Progress, RunSites, new_run, run_federation
from fed_auc.store.records import RoundRecord
from fed_auc.store.run_store import RunStore
from fed_auc.transport.flower import backoff
from fed_auc.transport.flower.coordinator_watch import end_with_coordinator
from fed_auc.transport.flower.identity import SiteIdentities
from fed_auc.transport.flower.transport import FlowerTransport


class ConsoleProgress(Progress):
    """The coordinator's lines: the sites, each round, each warm-up round."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.warmup_rounds = 0
        self.positive_class: list[str] | None = None

    def started(self, run_id: str, config: ExperimentConfig, sites: RunSites) -> None:
        self.warmup_rounds, self.positive_class = config.warmup_rounds, sites.positive_class()

    def warmup_round(self, record: RoundRecord) -> None:
        name = f"warm-up {record.round}/{self.warmup_rounds}"
        self.log(_progress(record, self.positive_class, name))

    def round(self, record: RoundRecord) -> None:
        self.log(_progress(record, self.positive_class))


def run_experiment(
    grid: Grid, experiment: dict[str, Any], log=print, make_transport=FlowerTransport
) -> dict[str, Any]:
    """What ``run_simulation`` does, with the sites behind Flower instead of in-process: the
    run ``experiment["run_id"]`` (made by ``fed-auc coordinator``; ``resume``: it has rounds).
    ``make_transport(grid, setup, settings, log, event, identities)``: FlowerTransport's."""
    config = ExperimentConfig(**experiment["experiment"])
    settings = FlowerSettings(**experiment["flower"])
    run_id, resume = experiment["run_id"], bool(experiment.get("resume"))
    torch.manual_seed(config.seed)
    store = RunStore(config.runs_dir)

    def event(site: str | None, level: str, message: str) -> None:
        """Recorded in the store and shown in the coordinator's log: an operator watching it
        sees a site leave or rejoin when it happens, not only in the dashboard."""
        store.add_event(run_id, message, level, site)
        log(message)

    with store.failure_recorded(run_id):
        identities = SiteIdentities.for_run(experiment, store.run(run_id)["config"], run_id)
        setup = _registration_setup(config, run_id, settings)
        transport = make_transport(grid, setup, settings, log, event, identities)
    log(f"run {run_id}: waiting for {settings.expected_sites} site(s), "
        f"at least {settings.min_nodes}")  # fmt: skip
    return run_federation(
        config, transport, store, run_id, resuming=resume, expected=settings.expected_sites,
        pooled_scoring=settings.pooled_scoring, transport_name="flower",
        record=lambda sites: {"flower": asdict(settings), **identities.record(sites)},
        progress=ConsoleProgress(log),
    )  # fmt: skip


def run_leave_each_out(
    grid: Grid, experiment: dict[str, Any], log=print, make_transport=FlowerTransport
) -> dict[str, Any]:
    """``fed-auc coordinator --leave-each-out``: on the same nodes, the run
    ``experiment["run_id"]`` with every site, then one new run per registered site without it
    (``run_experiment`` with ``hold_out``), each scored at every site. The summary is the
    first run's, with ``leave_each_out``: per site its held-out and in-federation AUC."""
    from fed_auc.run.holdout import leave_each_out

    options = {**experiment["experiment"], "hold_out": []}
    base = {k: v for k, v in experiment.items() if k not in ("leave_each_out", "resume")}

    def train(held_out: list[str]) -> dict[str, Any]:
        if not held_out:
            return run_experiment(grid, {**base, "experiment": options}, log, make_transport)
        config = {**options, "hold_out": held_out}
        with RunStore(config["runs_dir"]) as store:
            record = {**config, "flower": experiment["flower"]}
            run_id = new_run(store, config["algorithm"], record)
        log(f"leave-each-out: run {run_id} trains without {held_out}")
        return run_experiment(
            grid, {**base, "experiment": config, "run_id": run_id}, log, make_transport
        )

    inside = train([])
    return {**inside, "leave_each_out": leave_each_out(None, train, inside)}


def _registration_setup(
    config: ExperimentConfig, run_id: str, settings: FlowerSettings
) -> NodeSetup:
    """The setup the nodes register with: registration needs their data and memory budget
    only; the data-dependent defaults (the network and lr among them) are settled from their
    answers. As for synthetic data (the lightest setup), or as for image files where only
    those accept the options given."""
    try:
        provisional = config.with_data_kind(True)
    except ValueError:
        provisional = config.with_data_kind(False)
    model = build_model(
        provisional.model, num_labels=config.num_labels, norm=provisional.model_norm()
    )
    return provisional.node_setup(
        run_id, model.config(), config.num_labels, settings.expected_sites
    )


def _progress(
    record: RoundRecord, positive_class: list[str] | None, name: str | None = None
) -> str:
    """The coordinator's line per round (``name``: ``round 7``, or ``warm-up 3/10``): who
    answered, pooled and mean site test AUC of the global model, the positive class."""
    status = [s.status for s in record.sites]
    done = status.count("completed")
    mean = auc_text(record.mean_site_auc, undefined="n/a")
    pooled = auc_text(record.global_auc, positive_class=class_text(positive_class), undefined="n/a")
    return (
        f"{name or f'round {record.round}'}: {done}/{len(status)} sites completed, dropped "
        f"{status.count('dropped')}, test set: mean site {mean}, pooled {pooled}, "
        f"{record.duration_s or 0:.1f} s"
    )


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """Read the experiment file ``fed-auc coordinator`` wrote, run it, leave the summary.

    Progress lines go to the experiment's progress file, which ``fed-auc coordinator`` prints
    as they come: Flower's own log stream delivers a ServerApp's output late, in bursts."""
    backoff.shorten()  # replies are pulled as soon as the nodes have pushed them
    path = Path(str(context.run_config["experiment-file"]))
    experiment = json.loads(path.read_text())
    end_with_coordinator(experiment)  # a SIGKILLed coordinator leaves no ServerApp running
    run = run_leave_each_out if experiment.get("leave_each_out") else run_experiment
    if "evaluation" in experiment:  # an evaluation-only run (fed-auc evaluate --federation)
        from fed_auc.transport.flower.evaluation import run_evaluation as run
    with open(experiment["progress_file"], "a", buffering=1) as progress:
        try:
            summary = run(grid, experiment, log=lambda line: print(line, file=progress))
        except Exception as exc:  # recorded in the store (failed, resumable) by the run
            summary = {"error": failure_line(exc, Path(experiment["summary_file"]).parent)}
    # The coordinator's console says a failure in one line (``fed-auc coordinator``), without
    # the traceback Flower would stream from a ServerApp that raises.
    Path(experiment["summary_file"]).write_text(json.dumps(summary, indent=2))


def failure_line(exc: Exception, work_dir: Path) -> str:
    """One line for a run that failed: a federation's own reason as it is; anything else
    with its type, its traceback kept in ``work_dir/serverapp_error.txt``."""
    if isinstance(exc, FederationError):
        return str(exc)
    path = work_dir / "serverapp_error.txt"
    path.write_text("".join(traceback.format_exception(exc)))
    return f"{type(exc).__name__}: {exc} (traceback in {path})"
