"""A hospital node: its own data, a warm model, and local state that survives restarts.

The node answers two requests, whatever the transport: ``train`` (run the backend's
``client_update`` on local data) and ``evaluate`` (score a model on local splits). Only
tensors of the model update and aggregate counts leave it; per-image scores leave only when
the request asks for pooled scoring (simulation does, to report pooled AUC).

Local state (control variates, the sampler's position) is committed in two steps, so a node
never keeps the effect of a reply the federation did not keep. After training, the new state
is written (atomically, checksummed) as *pending*; the coordinator's next request says which
of this site's replies it has committed (``commit``: round and phase of the last accepted
reply in a recorded round) and which reply of the current round it builds on (``continue``).
A pending state with the committed tag becomes the local state; one with the continued tag
is the working state for the next phase; any other (a reply that was dropped, rejected, or
lost to a coordinator crash) is thrown away and the node goes back to its committed state.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fed_auc.algorithms.base import Backend, Draw
from fed_auc.algorithms.partial import choose_groups, memory_table, parse_budget
from fed_auc.algorithms.personal import Personalization
from fed_auc.data.augment import Augment
from fed_auc.data.base import SiteData, Split
from fed_auc.data.digest import site_data_digest
from fed_auc.data.poisson import PoissonBatches
from fed_auc.data.sampling import BatchStream
from fed_auc.exchange import Broadcast, Evaluation, Reply, SplitEvaluation
from fed_auc.exchange.compression import compress_reply
from fed_auc.io import load_state, remove_stale_temporaries, save_state
from fed_auc.metrics.auc import per_label_auc
from fed_auc.metrics.operating_point import default_edges, score_bins
from fed_auc.metrics.roc import per_label_roc
from fed_auc.models import model_from_config
from fed_auc.node.compute import Compute, Meter, to_host
from fed_auc.privacy.accounting import release_key
from fed_auc.privacy.dp_sgd import ExampleDP
from fed_auc.privacy.node_privacy import node_privacy
from fed_auc.privacy.secure.messages import CONFIG_KEY
from fed_auc.privacy.update_dp import UpdateDP
from fed_auc.trainable import Tensors, Trainable
from fed_auc.tta import check_tta, default_tta, predict

LOCAL_STATE_FILE = "local_state.pt"
PENDING_STATE_FILE = "local_state.pending.pt"
AUGMENT_SEED_OFFSET = 7_919  # the augmentation draws from its own stream, not the sampler's


def label_bins(
    labels: np.ndarray, scores: np.ndarray, thresholds: list[float] | None
) -> list[dict[str, Any]] | None:
    """Per label, the score counts with that label's threshold among the bin edges."""
    if thresholds is None:
        return None
    if len(thresholds) != labels.shape[1]:
        raise ValueError(f"{len(thresholds)} thresholds for {labels.shape[1]} labels")
    return [
        score_bins(labels[:, j], scores[:, j], default_edges([t])).to_dict()
        for j, t in enumerate(thresholds)
    ]


@dataclass(frozen=True)
class LocalTraining:
    """How a node trains, settled once from the experiment (``NodeSetup``) and its site file
    (``SiteHosting``) by ``build_node``: what a test or benchmark gives directly."""

    model_config: dict[str, Any]
    loss: str
    batch_size: int = 32
    min_pos_fraction: float = 0.05
    min_neg_fraction: float = 0.0
    seed: int = 0  # the batch sampler's (and, offset, the augmentation's)
    augment: str = "none"
    tta: str | None = None  # None: the default for ``augment``, as in ``fed-auc simulate``
    local_steps: int | None = None  # the site's own τ_i, which DP's planner plans for
    memory_budget: float | int | str | None = None  # partial training: what the budget allows
    personalization: Personalization | None = None


class Node:
    """One site's participant in the federation."""

    def __init__(
        self,
        site: SiteData,
        backend: Backend,
        training: LocalTraining,
        state_dir: str | Path,
        privacy: UpdateDP | ExampleDP | None = None,
        compute: Compute | None = None,
        trainable: Trainable | None = None,
        state_in_memory: bool = True,
        run_setup: dict[str, Any] | None = None,
    ) -> None:
        """``privacy``: update-level DP (``UpdateDP``) or DP-SGD (``ExampleDP``), noised from
        a secret only this node holds. ``compute``: the device and precision the operator
        chose (None: fp32 on the CPU); the whole local step and scoring run there, while
        local state and replies stay fp32 on the CPU, so what is saved and what travels does
        not depend on it. ``trainable``: a warm model shared with other in-process nodes
        (every request loads the global tensors into it first, so it carries nothing from one
        site to the next); None builds this node's own. ``state_in_memory`` False keeps the
        local state on disk only between rounds, so a simulation of hundreds of sites holds
        one at a time. ``run_setup``: the experiment's setup as this node got it
        (``NodeSetup.to_dict``), fixed with the data's digest at the run's first release."""
        self.site = site
        self.training = training
        self.tta = check_tta(
            default_tta(training.augment) if training.tta is None else training.tta
        )
        self.backend = backend
        self.state_path = Path(state_dir) / LOCAL_STATE_FILE
        self.pending_path = Path(state_dir) / PENDING_STATE_FILE
        for path in (self.state_path, self.pending_path):  # left by a node killed mid-write
            remove_stale_temporaries(path)
        self.compute = compute or Compute(torch.device("cpu"))
        self.privacy = node_privacy(privacy, site.name, state_dir)  # no DP, update DP, DP-SGD
        self.privacy.check_compute(self.compute)
        self.run_setup = run_setup
        self._run: dict[str, Any] | None = None  # the run's setup and data digest, when asked
        self.trainable = self._trainable(trainable)
        self.state_in_memory = state_in_memory
        self.personalization = training.personalization
        if self.personalization is not None:
            self.personalization.check_backend(backend)
            self.personalization.setup(self.trainable)
        self._personal: dict[str, Any] = {}  # personal model (personalization), same file
        stream = PoissonBatches if self.privacy.poisson else BatchStream
        augment = training.augment
        self.batches = stream(
            site.train,
            training.batch_size,
            seed=self.privacy.sampler_seed(training.seed),
            min_pos_fraction=training.min_pos_fraction,
            min_neg_fraction=training.min_neg_fraction,
            augment=None
            if augment == "none"
            else Augment(augment, training.seed + AUGMENT_SEED_OFFSET),
        )
        self.batches.pin_memory = self.compute.pins_memory  # a cached split's reads, for CUDA
        # what changes a release's computation, besides the request and the local state
        self._settings = {
            "backend": backend.name, "hyperparameters": backend.hyperparameters(),
            "loss": training.loss, "batch_size": training.batch_size, "augment": augment,
            "floors": [training.min_pos_fraction, training.min_neg_fraction],
            "trained_groups": self.trainable.trained_groups,
            "personalize": None if self.personalization is None else repr(self.personalization),
            "dp": repr(privacy),
            "compute": self.compute.describe(),  # another device or precision: other numbers
        }  # fmt: skip
        self.privacy.attach(backend, self.batches, self.private_draws, training.local_steps)
        self._initial_sampler = self.batches.state_dict()
        self._local_state: dict[str, Any] | None = None  # the working state, in memory
        self._pending_tag: list[int] | None = None  # [round, phase] of the pending state
        self._secure = None  # this site's side of secure aggregation, made when first asked

    def _trainable(self, shared: Trainable | None) -> Trainable:
        """The model and loss on this node's device: the shared warm one, or its own, of which
        partial training trains only the suffix the site's memory budget allows."""
        training, name = self.training, self.site.name
        own = training.memory_budget is not None or training.personalization is not None
        if shared is not None and own:
            raise ValueError("partial training and personal models need a node's own model")
        if shared is None:
            shared = Trainable.with_loss(model_from_config(training.model_config), training.loss)
        trainable = shared.to(self.compute.device)
        trainable.loss_scale = self.compute.loss_scale()
        if training.memory_budget is not None:
            where = f"site {name!r} memory_budget"
            image_side = int(self.site.train.images.shape[-1])
            table = memory_table(training.model_config, training.batch_size, image_side)
            groups = choose_groups(table, parse_budget(training.memory_budget, where), where)
            if groups is not None:
                trainable.train_only(groups)
        return trainable

    @property
    def name(self) -> str:
        return self.site.name

    def private_draws(self, local_steps: int) -> list[Draw]:
        """What one round draws from the training data (DP-SGD's plan): every phase's
        ``Backend.private_draws``, plus the personal model's own steps (``l2``)."""
        draws = []
        for phase in self.backend.phases:
            drawn = self.backend.private_draws(phase, local_steps)
            draws += drawn
            if self.personalization is not None and any(d.kind == "batch" for d in drawn):
                draws += self.personalization.private_draws(local_steps)
        return draws

    def registration(self) -> dict[str, Any]:
        """Aggregate counts the coordinator needs (global prevalence), and the device and
        precision this node computes in (recorded per site); no images, no labels."""
        split = self.site.train
        return {
            "n": len(split),
            "positives": split.positives(),
            "known": split.known(),
            "trained_groups": self.trainable.trained_groups,
            **self.compute.describe(),
        }

    def train(self, broadcast: Broadcast) -> Reply:
        """Run the backend's local update and write the new state as pending before replying."""
        privacy = self.privacy
        run = self.run_record() if privacy.accounted else None
        privacy.check_open(run)  # the setup of the run's first release; a budget not spent
        self._sync_local_state(broadcast)
        key = ""  # the release this update makes: everything that fixes its computation
        if privacy.accounted:
            local = {"backend": self._local_state, "personal": self._personal}
            # the run's setup and data, less its id (a name, not a computation)
            fixed = {**run, "setup": {k: v for k, v in run["setup"].items() if k != "run_id"}}
            settings = {**self._settings, "run": fixed}
            key = release_key(self.name, broadcast, self.batches.state_dict(), settings, local)
        if self.trainable.is_minimax:
            self.trainable.loss.set_pos_ratio(broadcast.config["pos_ratio"])
        reply, meter, images, log = self._update(broadcast, key)
        reply.site, reply.round, reply.phase = self.name, broadcast.round, broadcast.phase
        reply.num_examples = len(self.site.train)
        reply.trained_groups = self.trainable.trained_groups
        try:  # counted in the site's ledger before it leaves, or not sent at all
            sent = privacy.release(reply, broadcast, key, log)
        except Exception:
            self._local_state, self._personal = None, {}  # back to what is on disk
            raise
        wire = sent
        if CONFIG_KEY in broadcast.config:  # secure aggregation: only the masked vector leaves
            wire = self._client().masked_reply(sent, broadcast, self.backend)
        else:  # compressed after the privacy mechanism: ε is unchanged
            wire, sent = compress_reply(sent, broadcast)
        if sent is not reply:  # the state kept must match what the coordinator will read
            self._local_state = self.backend.reply_sent(reply, sent, broadcast, self._local_state)
        reply = wire
        reply.metrics = {**reply.metrics, **meter.metrics(images)}
        self._pending_tag = [broadcast.round, self.backend.phases.index(broadcast.phase)]
        state = {
            "tag": self._pending_tag,
            "backend": self._local_state,
            "sampler": self.batches.state_dict(),
        }
        if self._personal:
            state["personal"] = self._personal
        save_state(state, self.pending_path)
        if not self.state_in_memory:  # read back from the pending file when next asked
            self._local_state, self._personal = None, {}
        return reply

    def run_record(self) -> dict[str, Any]:
        """What the run's releases are computed from besides each request: the setup and the
        site data's digest (``data``: what a lifetime budget names the dataset by), hashed
        once per node."""
        if self._run is None:
            self._run = {"setup": self.run_setup or {}, "data": site_data_digest(self.site)}
        return self._run

    def _update(self, broadcast: Broadcast, key: str) -> tuple[Reply, Meter, int, Any]:
        """The backend's local update on the node's device, measured; the reply and the new
        local state come back fp32 on the CPU (what travels and what is saved), with the
        privacy mechanism's log of what it drew."""
        compute = self.compute
        batches = compute.batches(self.batches)
        on_device = dataclasses.replace(broadcast, tensors=compute.move(broadcast.tensors))
        local = compute.move(self._local_state)
        with (
            self.privacy.update(self.trainable, key) as log,
            compute.autocast(),
            Meter(compute.device) as meter,
        ):
            if self.personalization is None:
                reply, local = self.backend.client_update(on_device, local, self.trainable, batches)
            else:
                reply, local, personal = self.personalization.train(
                    self.backend, on_device, local, compute.move(self._personal),
                    self.trainable, batches,
                )  # fmt: skip
                self._personal = to_host(personal)
        self._local_state = to_host(local)
        reply.tensors = to_host(reply.tensors)
        return reply, meter, batches.images, log

    def secure_step(self, step: str, message: dict[str, Any]) -> dict[str, Any]:
        """Answer a step of secure aggregation (``fed_auc.privacy.secure``)."""
        return self._client().handle(step, message)

    def _client(self):
        if self._secure is None:  # the cryptography libraries load only when asked for
            from fed_auc.privacy.secure.checks import LEDGER_FILE, SessionLedger
            from fed_auc.privacy.secure.client import SecureClient

            ledger = SessionLedger(self.state_path.parent / LEDGER_FILE)
            owed = self.backend.site_weight(len(self.site.train))
            self._secure = SecureClient(self.name, owed_weight=owed, ledger=ledger)
        return self._secure

    def _sync_local_state(self, broadcast: Broadcast) -> None:
        """Promote, continue from or discard the pending state, as the request says."""
        if self._pending_tag is None and self.pending_path.exists():  # after a restart
            self._pending_tag = load_state(self.pending_path)["tag"]
            self._local_state = None
        # A driver that does not speak the protocol (a test, a script) keeps every state.
        commit = broadcast.config.get("commit", self._pending_tag)
        follow = broadcast.config.get("continue")
        if self._pending_tag is not None:
            tag, self._pending_tag = self._pending_tag, None
            if tag == follow:  # a later phase of the round in progress
                self._pending_tag = tag
                self._load(self.pending_path)
                return
            if tag == commit:
                self._load(self.pending_path)
                os.replace(self.pending_path, self.state_path)
                return
            self.pending_path.unlink(missing_ok=True)  # never kept by the federation
            self._local_state = None
        if self._local_state is None:
            self._load(self.state_path)

    def _load(self, path: Path) -> None:
        """Make the state saved at ``path`` the working one (no-op if it already is)."""
        if self._local_state is not None and path == self.pending_path:
            return  # the working state is the pending one, still in memory
        saved = load_state(path) if path.exists() else {}
        self.batches.load_state_dict(saved.get("sampler", self._initial_sampler))
        self._local_state = saved.get("backend", {})
        self._personal = saved.get("personal", {})

    @torch.no_grad()
    def evaluate(
        self,
        tensors: Tensors,
        splits: tuple[str, ...] = ("val", "test"),
        pooled: bool = False,
        thresholds: list[float] | None = None,
    ) -> Evaluation:
        """Score the given model on local splits: AUC with CI per label, and counts.
        ``thresholds`` (per label, the model card's): also bin the test scores per label with
        these thresholds among the edges, for operating points without per-image scores."""
        start = time.perf_counter()
        result = Evaluation(self.name, self._score(tensors, splits, pooled, thresholds))
        if self.personalization is not None:  # and the site's own model, scored here only
            if self._local_state is None:  # nothing loaded yet: the latest state on disk
                newest = self.pending_path if self.pending_path.exists() else self.state_path
                saved = load_state(newest) if newest.exists() else {}
                self._personal = saved.get("personal", {})
            personal = self.personalization.model(tensors, self._personal)
            if personal is not None:
                result.personal = self._score(personal, splits, pooled=False)
        result.duration_s = time.perf_counter() - start
        return result

    def _score(
        self,
        tensors: Tensors,
        splits: tuple[str, ...],
        pooled: bool,
        thresholds: list[float] | None = None,
    ) -> dict[str, SplitEvaluation]:
        self.trainable.load(tensors)
        out = {}
        for name in splits:
            split: Split = getattr(self.site, name)
            scores = self.scores(split.images)
            labels = split.labels.numpy()
            out[name] = SplitEvaluation(
                n=len(split),
                positives=split.positives(),
                aucs=per_label_auc(labels, scores),
                scores=scores if pooled else None,
                labels=labels if pooled else None,
                roc=per_label_roc(labels, scores) if name == "test" else None,
                bins=label_bins(labels, scores, thresholds) if name == "test" else None,
            )
        return out

    @torch.no_grad()
    def scores(self, images: torch.Tensor) -> np.ndarray:
        """h = sigmoid(logit) for every image, in eval mode, averaged over the TTA views (on
        the node's device and precision)."""
        with self.compute.autocast():
            model, pins = self.trainable.model, self.compute.pins_memory
            return predict(model, images, self.tta, pin_memory=pins)
