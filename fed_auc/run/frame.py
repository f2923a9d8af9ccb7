"""The one frame around a federated run, whatever the transport: register the sites once, learn
the run's sites, open the run (new or resumed), train, export, close.

``fed-auc simulate`` (``fed_auc.simulation``) and the Flower ServerApp
(``fed_auc.transport.flower.server``) are each a short function into ``run_federation``; they
differ only in the ``Transport`` they hand it. Held-out sites are handled one way
(``TrainingSites``), the config is turned into the nodes' setup once here, a training run is
created only by ``new_run``, and a failure is recorded the store's one way
(``RunStore.failure_recorded``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fed_auc.coordinator.loop import Coordinator
from fed_auc.coordinator.selection import BestModel
from fed_auc.data.base import common_label_count
from fed_auc.data.cards import data_record
from fed_auc.data.labels import federation_positive_class
from fed_auc.exchange import Registration, Transport
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.node.setup import NodeSetup
from fed_auc.run.holdout import TrainingSites, evaluate_export
from fed_auc.run.initial import StartingPoint, load_starting_point, starting_point
from fed_auc.run.lifecycle import close_run, train
from fed_auc.run.start import start_coordinator
from fed_auc.run.warmup import warm_start
from fed_auc.store.records import RoundRecord
from fed_auc.store.run_store import RunStore, git_revision
from fed_auc.trainable import Trainable


@dataclass(frozen=True)
class RunSites:
    """What a run knows of its training sites once they are loaded or registered: each
    one's data card summary, their common number of labels, how many the nodes' setup counts
    (personalization's default head learning rate), the τ_i their own files set, and what
    the run records about the data it ran on (``data.cards.data_record``)."""

    cards: dict[str, dict[str, Any]]
    num_labels: int
    expected: int
    fixed_steps: dict[str, int]
    record: dict[str, Any]
    label_names: list[str] | None = None  # the sites' common labels, checked against --init
    data_cards: list[dict[str, Any]] = field(default_factory=list)  # for the model card

    def positive_class(self) -> list[str] | None:
        """The sites' positive class as their cards name it, checked against --init."""
        return federation_positive_class(list(self.cards.values()))


class Progress:
    """What an entry point is told as its run goes; every method does nothing by default."""

    def started(self, run_id: str, config: ExperimentConfig, sites: RunSites) -> None:
        """The run exists (new or resumed), its config settled, its sites known."""

    def log(self, line: str) -> None:
        """A line for the operator (the Flower coordinator prints them)."""

    def warmup_round(self, record: RoundRecord) -> None:
        """A warm-up round was recorded."""

    def round(self, record: RoundRecord) -> None:
        """A round of the run was recorded."""


@dataclass
class OpenRun:
    """A run opened by the frame, ready for ``coordinator.run``."""

    config: ExperimentConfig  # settled: its data-kind defaults filled in
    coordinator: Coordinator
    setup: NodeSetup
    store: RunStore
    run_id: str
    run_dir: Path
    sites: RunSites
    transport: Transport  # every site, held-out ones too
    best: BestModel  # the export's candidates, the warm-up's rounds among them


def new_run(store: RunStore, algorithm: str, record: dict[str, Any]) -> str:
    """A new run in the store (status running): the one way a run that trains is created."""
    return store.create_run(algorithm, record, git_revision())


def run_federation(
    config: ExperimentConfig,
    transport: Transport,
    store: RunStore,
    run_id: str | None = None,
    *,
    progress: Progress | None = None,
    pooled_scoring: bool = True,
    transport_name: str = "local",
    **options: Any,
) -> dict[str, Any]:
    """Open the run (``open_federation``, same arguments), train its missing rounds, export
    the selected model, close the run; with held-out sites, score the export at every site
    (``transport_name`` recorded with it). Returns the run's JSON summary."""
    progress = progress or Progress()
    run = open_federation(config, transport, store, run_id, progress=progress,
                          pooled_scoring=pooled_scoring, **options)  # fmt: skip
    config = run.config
    with store.failure_recorded(run.run_id):
        labels = int(run.setup.model_config["num_labels"])
        trained = train(config, run.coordinator, run.best, labels, progress.round,
                        pooled_scoring)  # fmt: skip
    summary = close_run(store, run.run_id, run.run_dir, config, run.coordinator, trained,
                        run.setup.model_config, run.sites.data_cards)  # fmt: skip
    summary["sites"] = list(run.sites.cards)  # the sites that trained, in federation order
    if config.hold_out is not None:  # external validation: the export scored at every site
        progress.log(f"run {run.run_id}: scoring the exported model at every site")
        summary["evaluation"] = evaluate_export(
            run.transport, config.runs_dir, run.run_id, summary["model_path"], transport_name
        )
    transport.end("completed")  # the nodes say so, not that the coordinator is gone
    return summary


def open_federation(
    config: ExperimentConfig,
    transport: Transport,
    store: RunStore,
    run_id: str | None = None,
    *,
    resuming: bool = False,
    sites: RunSites | None = None,
    start: StartingPoint | None = None,
    expected: int | None = None,
    pooled_scoring: bool = True,
    record: Callable[[list[str]], dict[str, Any]] | None = None,
    progress: Progress | None = None,
) -> OpenRun:
    """Register the sites once, learn the run's sites, create the run (``run_id`` None) or
    take the existing one, and open it (``open_run``).

    ``sites``: the run's sites when the entry point knows them before any node registers
    (in-process, from their data): the nodes then register under the run's own setup; None:
    learned from the registrations (Flower: the nodes register under the setup the transport
    was built with). ``start``: the round-0 network when already built (an ``--init`` file
    checked before the run exists). ``expected``: the number of sites the setup counts
    (default: the training sites). ``record(sites)``: more to record with the run's config
    once its sites are known (an existing run's config is then rewritten); ``resuming``: the
    run has rounds to continue from; ``pooled_scoring``: whether validation scores may leave
    the sites (always in-process; over Flower as its settings say)."""
    progress = progress or Progress()
    held_out = config.hold_out or []
    registrations: dict[str, Registration] | None = None
    with store.failure_recorded(run_id) if run_id is not None else nullcontext():
        if sites is None:
            registrations = transport.register()
            training = TrainingSites(transport, held_out, registrations).register()
            progress.log(f"run {run_id}: sites {list(training)}")
            sites = sites_of(training, transport.summaries, expected)
            # the data-dependent defaults (the network and lr among them), from the answers
            config = config.with_data_kind(all(r["synthetic"] for r in training.values()))
        recorded = {**config.to_dict(), **sites.record}
        if record is not None and run_id is not None:
            store.update_config(run_id, {**recorded, **record(list(sites.cards))})
        if start is None:
            start = starting_point(
                config, sites.num_labels, sites.label_names, sites.positive_class()
            )
    if run_id is None:
        run_id = new_run(store, config.algorithm, recorded)
    progress.started(run_id, config, sites)
    with store.failure_recorded(run_id):
        setup = config.node_setup(run_id, start.model.config(), sites.num_labels, sites.expected)
        if registrations is None:  # in-process: the nodes register under the run's setup
            registrations = transport.use(setup).register()
        training = TrainingSites(transport, held_out, registrations)
        run_dir = Path(config.runs_dir) / run_id
        best = BestModel(run_dir, config.select, initial_candidate=config.init is not None)
        coordinator = open_run(config, store, run_id, sites, setup, start, training, resuming,
                               pooled_scoring, progress.warmup_round, best)  # fmt: skip
        if coordinator.committed_round is not None:
            progress.log(f"run {run_id}: resumed after round {coordinator.committed_round}")
    return OpenRun(config, coordinator, setup, store, run_id, run_dir, sites, transport, best)


def sites_of(
    registrations: dict[str, Registration],
    summaries: dict[str, dict[str, Any]],
    expected: int | None,
) -> RunSites:
    """The run's sites as their registrations and data card summaries say (a transport that
    learns its sites only when they register): what the run records of the data it really
    ran on, the registered sites' own (``data_record``), as in-process for the same files."""
    names = list(registrations)
    cards = {site: summaries[site] for site in names}
    return RunSites(
        cards=cards,
        num_labels=common_label_count({s: r["label_names"] for s, r in registrations.items()}),
        expected=len(names) if expected is None else expected,
        # a site file's own τ_i: the requests ask for it, so its replies' steps are checked
        # against what it runs (fed_auc.coordinator.screening)
        fixed_steps={
            site: int(r["local_steps"])
            for site, r in registrations.items()
            if r.get("local_steps") is not None
        },
        record=data_record(list(cards.values()), site_files=True),
        label_names=list(registrations[names[0]]["label_names"]) if names else None,
        data_cards=list(cards.values()),
    )


def open_run(
    config: ExperimentConfig,
    store: RunStore,
    run_id: str,
    sites: RunSites,
    setup: NodeSetup,
    start: StartingPoint,
    transport: Transport,
    resuming: bool,
    pooled_scoring: bool = True,
    on_warmup_round: Callable[[RoundRecord], None] | None = None,
    best: BestModel | None = None,
) -> Coordinator:
    """Open the run ``run_id`` on its known ``sites``: the round-0 network, the warm-up
    (unless the run already has rounds), the coordinator, and the store's first rows, or
    (``resuming``) the last checkpoint. ``transport``: the training sites, registered;
    ``transport.use(setup)`` reaches their nodes running ``setup`` (the warm-up's, then the
    run's). ``best``: the export's candidates, offered the warm-up's rounds."""
    run_dir = Path(config.runs_dir) / run_id
    model = start.model
    server = Trainable.with_loss(model, config.loss)
    personalization = setup.personalization()
    personal = personalization.personal_names(server.names()) if personalization else ()
    started = resuming and not store.rounds(run_id).empty
    for message in load_starting_point(server, start, run_dir, started):
        store.add_event(run_id, message)
    if config.warmup_rounds and not started:

        def warm_transport(warm_id: str, hyperparameters: dict) -> Transport:
            warm = setup.for_run(warm_id, "fedavg", "ce", hyperparameters)
            return transport.use(warm)

        server.load(
            warm_start(
                config,
                model,
                store,
                run_id,
                run_dir,
                warm_transport,
                lambda record: new_run(store, "fedavg", record),
                pooled_scoring,
                personal,
                sites.record,
                sites.fixed_steps,
                on_warmup_round,
                best,
            )  # fmt: skip
        )
    coordinator = start_coordinator(
        config, transport.use(setup), store, run_id, run_dir, server, personal,
        sites.fixed_steps, pooled_scoring,
    )  # fmt: skip
    if resuming:
        last = coordinator.resume()
        store.reopen_run(run_id, f"run resumed after round {last}")
    if not started:
        store.record_sites(run_id, sites.cards)
        store.add_event(
            run_id, f"run started: {config.algorithm} on {len(sites.cards)} sites "
            f"{sorted(sites.cards)}"
        )  # fmt: skip
        if config.hold_out:
            store.add_event(run_id, f"held out of training: {config.hold_out}")
    return coordinator
