"""A whole federation on one machine: in-process nodes, one coordinator, no network.

The sites are the synthetic demo federation, one data set split by a partitioner, or the
site files given (``--site``), which ``fed-auc node`` serves over Flower with the same code.
``run_simulation`` builds the parts, runs the rounds, records them and exports the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fed_auc.coordinator.loop import Coordinator
from fed_auc.data.base import SiteData, common_label_count
from fed_auc.data.cards import data_card, data_record, site_summary
from fed_auc.data.partition import PARTITION_FILE
from fed_auc.data.spec import load_sites
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.experiment.files import recorded_config
from fed_auc.io import save_json
from fed_auc.models import model_from_config
from fed_auc.node.build import build_node
from fed_auc.node.compute import Compute
from fed_auc.node.setup import NodeSetup, SiteHosting, check_batch_size
from fed_auc.run.holdout import check_hold_out, evaluate_export
from fed_auc.run.initial import starting_point
from fed_auc.run.lifecycle import RunSites, fail_run, open_run, train_and_close
from fed_auc.site import SiteDefinition, check_site_data, load_site_files
from fed_auc.store.records import RoundRecord
from fed_auc.store.run_store import RunStore, git_revision, run_to_resume
from fed_auc.trainable import Trainable
from fed_auc.transport.local import LocalTransport

STATE_IN_MEMORY_UP_TO = 16  # sites whose node local state stays in memory between rounds


@dataclass
class Federation:
    """The assembled parts of a simulated run, ready for ``coordinator.run``."""

    config: ExperimentConfig
    sites: list[SiteData]
    coordinator: Coordinator
    store: RunStore
    run_id: str
    run_dir: Path
    model_config: dict[str, Any]
    every_site: LocalTransport | None = None  # with hold_out: all sites, for the evaluation


@dataclass
class InProcessSite:
    """A site as simulate runs it: its data and what its operator chose for its node."""

    data: SiteData
    hosting: SiteHosting


def load_in_process_sites(config: ExperimentConfig) -> tuple[list[InProcessSite], dict | None]:
    """The sites of ``config``: its site files (each loaded as its node loads it), else the
    synthetic federation or ``config.data`` split by ``config.partition``."""
    if config.site_files is not None:
        return [_from_file(s, config) for s in load_site_files(config.site_files)], None
    sites, manifest = load_sites(
        config.data,
        config.partition,
        config.sites,
        config.seed,
        config.image_size,
        num_labels=config.num_labels,
        data_scale=config.data_scale,
        feature_shift=config.feature_shift,
        uncertain=config.uncertain,
        frontal_only=config.frontal_only,
        skip_bad_images=config.skip_bad_images,
        positive_label=config.positive_label,
        classes=config.classes,
        aspect=config.aspect,
        positive_class=config.positive_class,
    )
    synthetic = bool(config.data_is_synthetic())
    compute = Compute.of(config.device, config.precision)
    hosted = [
        InProcessSite(
            s, SiteHosting(s.name, i, (i, s.name), synthetic, memory_budget=b, compute=compute)
        )
        for i, (s, b) in enumerate(zip(sites, config.memory_budgets(), strict=True))
    ]
    return hosted, manifest


def _from_file(site: SiteDefinition, config: ExperimentConfig) -> InProcessSite:
    data = site.load(config.image_size, config.num_labels, config.seed, config.data_scale)
    check_site_data(site, data)
    return InProcessSite(data, site.hosting(config.device, config.precision))


def build_federation(
    config: ExperimentConfig,
    run_id: str | None = None,
    on_run: Callable[[str], None] | None = None,
    on_warmup_round: Callable[[RoundRecord], None] | None = None,
) -> Federation:
    """The sites, one in-process node each, a coordinator (after the optional warm-up), and a
    run in the store: a new one, or the existing ``run_id``, resumed from its last round.
    ``on_run(run_id)``: told the run's id as soon as it exists (to say how to resume it);
    ``on_warmup_round``: told each warm-up round (a progress bar counts them)."""
    torch.manual_seed(config.seed)
    everyone, manifest = load_in_process_sites(config)
    held_out = config.hold_out or []
    check_hold_out(held_out, [s.data.name for s in everyone])
    for site in everyone:  # before the run exists: a bad batch size records nothing
        check_batch_size(site.data, config.batch_size)
    sites = [s for s in everyone if s.data.name not in held_out]  # the ones that train
    data = [site.data for site in sites]
    run_sites = RunSites(
        cards={s.name: site_summary(s) for s in data},
        num_labels=common_label_count({s.name: s.label_names for s in data}),
        expected=len(sites),
        fixed_steps={
            s.data.name: s.hosting.local_steps for s in sites if s.hosting.local_steps is not None
        },
        # what the run really runs on (as a Flower run on the same site files records it)
        record=data_record([data_card(s) for s in data], config.site_files is not None),
        label_names=list(data[0].label_names) if data else None,
    )
    # --init read and checked before the run exists: a refused file records nothing
    start = starting_point(
        config, run_sites.num_labels, run_sites.label_names, run_sites.positive_class()
    )
    store = RunStore(config.runs_dir)
    resuming = run_id is not None
    if run_id is None:
        recorded = {**config.to_dict(), **run_sites.record}
        run_id = store.create_run(config.algorithm, recorded, git_revision())
    run_dir = Path(config.runs_dir) / run_id
    if on_run is not None:
        on_run(run_id)
    try:  # from here on, a failure or a stop (Ctrl-C, SIGTERM) marks the run failed
        if manifest is not None:
            save_json(manifest, run_dir / PARTITION_FILE)

        def nodes_for(setup: NodeSetup, folder: str) -> LocalTransport:
            return _transport(setup, sites, run_dir / folder)

        coordinator, setup = open_run(
            config, store, run_id, run_sites, nodes_for, resuming, start=start,
            on_warmup_round=on_warmup_round,
        )  # fmt: skip
        every_site = None
        if config.hold_out is not None:
            every_site = _transport(setup, everyone, run_dir / "evaluation_nodes")
    except BaseException as exc:
        fail_run(store, run_id, exc)
        raise
    return Federation(
        config, data, coordinator, store, run_id, run_dir, setup.model_config, every_site
    )


def _transport(setup: NodeSetup, sites: list[InProcessSite], run_dir: Path) -> LocalTransport:
    """One in-process node per site, its local state under ``run_dir/nodes/<site>``.

    Nodes run one after another, so unless a site trains its own part of the model (partial
    training) or keeps a personal one, or the sites compute on different devices, they share
    one warm model. Beyond
    ``STATE_IN_MEMORY_UP_TO`` sites the local state (e.g. CODASCA's c_k, one model's size per
    site) stays on disk between rounds: memory then does not grow with the number of sites.
    """
    shared = None
    one_compute = len({site.hosting.compute for site in sites}) <= 1
    if setup.personalization() is None and not setup.partial_training and one_compute:
        shared = Trainable.with_loss(model_from_config(setup.model_config), setup.loss)
    nodes = [
        build_node(
            setup,
            site.data,
            site.hosting,
            run_dir / "nodes" / site.data.name,
            trainable=shared,
            state_in_memory=len(sites) <= STATE_IN_MEMORY_UP_TO,
        )
        for site in sites
    ]
    return LocalTransport(nodes, [site.hosting for site in sites], setup)


def run_simulation(
    config: ExperimentConfig,
    on_round: Callable[[RoundRecord], None] | None = None,
    on_run: Callable[[str], None] | None = None,
    on_warmup_round: Callable[[RoundRecord], None] | None = None,
) -> dict[str, Any]:
    """Run the federation, record it in ``config.runs_dir`` and return the JSON summary."""
    return _complete(build_federation(config, None, on_run, on_warmup_round), on_round)


def resume_simulation(
    runs_dir: str | Path,
    run_id: str,
    on_round: Callable[[RoundRecord], None] | None = None,
    on_warmup_round: Callable[[RoundRecord], None] | None = None,
) -> dict[str, Any]:
    """Continue an interrupted run from its last recorded round, with its recorded config.

    Rounds already in the store are neither lost nor repeated; with the same seed the result
    equals the uninterrupted run's.
    """
    run = run_to_resume(runs_dir, run_id, "fed-auc simulate")
    config = recorded_config(run["config"], runs_dir)
    return _complete(build_federation(config, run_id, None, on_warmup_round), on_round)


def rounds_left(runs_dir: str | Path, run_id: str) -> int:
    """Rounds a resume of ``run_id`` still has to train (for a progress bar): a run stopped
    before its first round trains its warm-up again (``open_run``)."""
    with RunStore(runs_dir) as store:
        done = store.last_round(run_id) or 0
        config = store.run(run_id)["config"]
        warmup = 0 if not store.rounds(run_id).empty else int(config.get("warmup_rounds") or 0)
    return int(config["rounds"]) - done + warmup


def _complete(fed: Federation, on_round: Callable[[RoundRecord], None] | None) -> dict[str, Any]:
    cards = [data_card(site) for site in fed.sites]
    summary = train_and_close(
        fed.config, fed.coordinator, fed.run_dir, fed.model_config, cards, on_round
    )
    if fed.every_site is not None:
        summary["evaluation"] = evaluate_export(
            fed.every_site, fed.config.runs_dir, fed.run_id, summary["model_path"], "local"
        )
    return summary
