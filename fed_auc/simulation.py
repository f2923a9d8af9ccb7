"""A whole federation on one machine: in-process nodes, one coordinator, no network.

The sites are the synthetic demo federation, one data set split by a partitioner, or the
site files given (``--site``), which ``fed-auc node`` serves over Flower with the same code.
``run_simulation`` builds the parts, runs the rounds, records them and exports the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fed_auc.coordinator.loop import Coordinator
from fed_auc.data.base import SiteData, common_label_count
from fed_auc.data.cards import data_card, data_record, site_summary
from fed_auc.data.partition import PARTITION_FILE
from fed_auc.data.spec import load_sites
from fed_auc.exchange import (
    Broadcast,
    ComparisonRequest,
    Evaluation,
    EvaluationRequest,
    NodeFailure,
    Registration,
    Reply,
    Tensors,
)
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.experiment.files import recorded_config
from fed_auc.io import save_json
from fed_auc.models import model_from_config
from fed_auc.node.build import build_node
from fed_auc.node.compute import Compute
from fed_auc.node.host import NodeHost
from fed_auc.node.node import Node
from fed_auc.node.setup import NodeSetup, SiteHosting, check_batch_size
from fed_auc.run.frame import OpenRun, Progress, RunSites, open_federation, run_federation
from fed_auc.run.holdout import check_hold_out
from fed_auc.run.initial import starting_point
from fed_auc.site import SiteDefinition, check_site_data, load_site_files
from fed_auc.store.records import RoundRecord
from fed_auc.store.run_store import RunStore, run_to_resume
from fed_auc.trainable import Trainable
from fed_auc.transport.local import LocalTransport

WARMUP_DIR = "warmup"  # in the run's folder: the warm-up's checkpoints and nodes
STATE_IN_MEMORY_UP_TO = 16  # sites whose node local state stays in memory between rounds


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
        reading=config.data_reading(),
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


class InProcessSites:
    """The in-process transport of a run: every site's node in this process, built for the
    setup last ``use``d (one set of nodes for the run, one for its warm-up), each set
    registered once."""

    def __init__(self, sites: list[InProcessSite], runs_dir: str | Path) -> None:
        self.hosted = sites
        self.runs_dir = Path(runs_dir)
        self.summaries = {s.data.name: site_summary(s.data) for s in sites}
        self.current: LocalTransport | None = None
        self.main: str | None = None  # the run's id, once its setup is used
        self._built: dict[str, tuple[NodeSetup, LocalTransport]] = {}  # folder → its nodes
        self._registered: dict[str, dict[str, Registration]] = {}  # folder → its nodes'
        self.folder = ""

    def use(self, setup: NodeSetup) -> InProcessSites:
        """The nodes of ``setup``. The first setup is the run's own (its nodes' state under
        ``<run>/nodes``); another run on the same sites (the warm-up) keeps its nodes' state
        under ``<run>/warmup/nodes``."""
        if self.main is None:
            self.main = setup.run_id
        folder = "" if setup.run_id == self.main else WARMUP_DIR
        built = self._built.get(folder)
        if built is None or built[0] != setup:
            run_dir = self.runs_dir / self.main / folder
            self._built[folder] = (setup, _transport(setup, self.hosted, run_dir))
            self._registered.pop(folder, None)
        self.current, self.folder = self._built[folder][1], folder
        return self

    def register(self) -> dict[str, Registration]:
        """The current nodes' registrations, asked once."""
        if self.folder not in self._registered:
            self._registered[self.folder] = self.local.register()
        return self._registered[self.folder]

    @property
    def local(self) -> LocalTransport:
        """The nodes of the setup last ``use``d."""
        if self.current is None:
            raise RuntimeError("no nodes yet: use(setup) first")
        return self.current

    @property
    def sites(self) -> list[str]:
        return self.local.sites

    @property
    def nodes(self) -> dict[str, Node]:
        return self.local.nodes

    @property
    def hosts(self) -> dict[str, NodeHost]:
        return self.local.hosts

    def train(self, requests: Mapping[str, Broadcast]) -> dict[str, Reply | NodeFailure]:
        return self.local.train(requests)

    def secure(
        self, step: str, messages: Mapping[str, dict[str, Any]]
    ) -> dict[str, dict[str, Any] | NodeFailure]:
        return self.local.secure(step, messages)

    def evaluate(
        self,
        sites: Sequence[str],
        tensors: Tensors,
        pooled: bool = True,
        thresholds: list[float] | None = None,
    ) -> dict[str, Evaluation | NodeFailure]:
        return self.local.evaluate(sites, tensors, pooled, thresholds)

    def report(
        self, sites: Sequence[str], request: EvaluationRequest, tensors: Tensors
    ) -> dict[str, dict[str, Any] | NodeFailure]:
        return self.local.report(sites, request, tensors)

    def compare(
        self, sites: Sequence[str], request: ComparisonRequest, tensors: tuple[Tensors, Tensors]
    ) -> dict[str, dict[str, Any] | NodeFailure]:
        return self.local.compare(sites, request, tensors)

    def end(self, status: str) -> None:
        """Nothing to tell: the nodes end with this process."""


class SimulationProgress(Progress):
    """``run_simulation``'s callbacks, told as the frame goes."""

    def __init__(
        self,
        on_round: Callable[[RoundRecord], None] | None = None,
        on_run: Callable[[str], None] | None = None,
        on_warmup_round: Callable[[RoundRecord], None] | None = None,
        manifest: dict | None = None,
    ) -> None:
        self.on_round, self.on_run, self.on_warmup_round = on_round, on_run, on_warmup_round
        self.manifest = manifest

    def started(self, run_id: str, config: ExperimentConfig, sites: RunSites) -> None:
        if self.on_run is not None:
            self.on_run(run_id)
        if self.manifest is not None:
            save_json(self.manifest, Path(config.runs_dir) / run_id / PARTITION_FILE)

    def warmup_round(self, record: RoundRecord) -> None:
        if self.on_warmup_round is not None:
            self.on_warmup_round(record)

    def round(self, record: RoundRecord) -> None:
        if self.on_round is not None:
            self.on_round(record)


@dataclass
class Federation:
    """An opened in-process run, for tests and benchmarks that drive its coordinator."""

    sites: list[SiteData]  # the training sites' data
    run: OpenRun

    @property
    def coordinator(self) -> Coordinator:
        return self.run.coordinator

    @property
    def store(self) -> RunStore:
        return self.run.store

    @property
    def run_id(self) -> str:
        return self.run.run_id


def build_federation(
    config: ExperimentConfig,
    run_id: str | None = None,
    on_run: Callable[[str], None] | None = None,
    on_warmup_round: Callable[[RoundRecord], None] | None = None,
) -> Federation:
    """The run opened by the frame on in-process sites, not trained (``run_simulation``
    trains it): a new run, or the existing ``run_id``, resumed from its last round."""
    transport, options = _in_process(config, run_id, on_run, on_warmup_round)
    run = open_federation(config, transport, RunStore(config.runs_dir), run_id, **options)
    return Federation([site.data for site in transport.hosted if site.data.name in
                       run.sites.cards], run)  # fmt: skip


def run_simulation(
    config: ExperimentConfig,
    on_round: Callable[[RoundRecord], None] | None = None,
    on_run: Callable[[str], None] | None = None,
    on_warmup_round: Callable[[RoundRecord], None] | None = None,
) -> dict[str, Any]:
    """Run the federation, record it in ``config.runs_dir`` and return the JSON summary."""
    transport, options = _in_process(config, None, on_run, on_warmup_round, on_round)
    return run_federation(config, transport, RunStore(config.runs_dir), **options)


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
    transport, options = _in_process(config, run_id, None, on_warmup_round, on_round)
    return run_federation(config, transport, RunStore(config.runs_dir), run_id, **options)


def _in_process(
    config: ExperimentConfig,
    run_id: str | None,
    on_run: Callable[[str], None] | None,
    on_warmup_round: Callable[[RoundRecord], None] | None,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> tuple[InProcessSites, dict[str, Any]]:
    """The in-process sites of ``config`` and what the frame needs to know of them, checked
    before the run exists: a bad hold-out, batch size or ``--init`` file records nothing."""
    config.resolve_files()  # the site files' kind of data and the init file, read once here
    torch.manual_seed(config.seed)
    everyone, manifest = load_in_process_sites(config)
    held_out = config.hold_out or []
    check_hold_out(held_out, [s.data.name for s in everyone])
    for site in everyone:
        check_batch_size(site.data, config.batch_size)
    data = [s.data for s in everyone if s.data.name not in held_out]  # the ones that train
    sites = RunSites(
        cards={s.name: site_summary(s) for s in data},
        num_labels=common_label_count({s.name: s.label_names for s in data}),
        expected=len(data),
        fixed_steps={
            s.data.name: s.hosting.local_steps
            for s in everyone
            if s.data.name not in held_out and s.hosting.local_steps is not None
        },
        # what the run really runs on (as a Flower run on the same site files records it)
        record=data_record([data_card(s) for s in data], config.site_files is not None),
        label_names=list(data[0].label_names) if data else None,
        data_cards=[data_card(s) for s in data],
    )
    start = starting_point(config, sites.num_labels, sites.label_names, sites.positive_class())
    progress = SimulationProgress(on_round, on_run, on_warmup_round, manifest)
    options = {"resuming": run_id is not None, "sites": sites, "start": start,
               "progress": progress}  # fmt: skip
    return InProcessSites(everyone, config.runs_dir), options


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


def rounds_left(runs_dir: str | Path, run_id: str) -> int:
    """Rounds a resume of ``run_id`` still has to train (for a progress bar): a run stopped
    before its first round trains its warm-up again (``open_run``)."""
    with RunStore(runs_dir) as store:
        done = store.last_round(run_id) or 0
        config = store.run(run_id)["config"]
        warmup = 0 if not store.rounds(run_id).empty else int(config.get("warmup_rounds") or 0)
    return int(config["rounds"]) - done + warmup
