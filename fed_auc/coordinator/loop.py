"""The round loop: sample, dispatch, validate, aggregate, checkpoint, evaluate, record.

The coordinator owns no math: the backend plans and aggregates, the nodes train and score,
the store records. One round here is what DESIGN.md's "One round, as data flows" describes.

Crash safety: a round is *committed* when its row is in the store. Its checkpoint (server
state + which reply of every site was kept) is on disk before that, and the one before it is
kept too, so whatever the moment of a crash there is a checkpoint of the store's last round
to resume from. Nodes learn from each request which of their replies were committed and
drop the local state of any other (see ``fed_auc.node.node``).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from fed_auc.algorithms.base import Backend, ServerState
from fed_auc.algorithms.partial import model_groups
from fed_auc.coordinator.checkpoint import load_checkpoint, write_checkpoint
from fed_auc.coordinator.errors import BudgetsSpent, FederationError
from fed_auc.coordinator.policy import RoundPolicy
from fed_auc.coordinator.scores import record_scores
from fed_auc.coordinator.screening import InvalidReply, payload_size, validate_answer
from fed_auc.coordinator.signals import phase_signals, tensor_norm
from fed_auc.coordinator.wire import compressed_requests, decompressed
from fed_auc.exchange import (
    COMPUTE_METRICS,
    Broadcast,
    NodeFailure,
    Reply,
    Transport,
    payload_bytes,
)
from fed_auc.store.records import RoundRecord, SiteRound
from fed_auc.store.run_store import RunStore
from fed_auc.trainable import Trainable


def global_prevalence(registrations: Mapping[str, Mapping[str, Any]]) -> list[float]:
    """p per label: pooled positives over pooled known labels, from the sites' counts."""
    positives = np.sum([r["positives"] for r in registrations.values()], axis=0)
    known = np.sum([r["known"] for r in registrations.values()], axis=0)
    if np.any(positives == 0) or np.any(positives == known):
        raise FederationError(
            f"global prevalence must be in (0, 1) for every label; positives {positives.tolist()}"
            f" of {known.tolist()} known labels across sites"
        )
    return (positives / known).tolist()


def sample_sites(
    sites: Sequence[str], participation: float, seed: int, round_: int, phase: str = "train"
) -> list[str]:
    """Seeded partial participation without replacement: ⌈participation · N⌉ sites, ≥ 1."""
    k = max(1, int(np.ceil(participation * len(sites))))
    if k >= len(sites):
        return list(sites)
    chosen = random.Random(f"{seed}:{round_}:{phase}").sample(list(sites), k)
    return [s for s in sites if s in chosen]


class Coordinator:
    def __init__(
        self,
        backend: Backend,
        transport: Transport,
        store: RunStore,
        run_id: str,
        run_dir: str | Path,
        trainable: Trainable,
        policy: RoundPolicy | None = None,
        personal: Collection[str] = (),
    ) -> None:
        """``policy``: how each round runs (``RoundPolicy``; default: every site, every round
        evaluated, the backend's mean). ``personal``: tensors that stay on the nodes."""
        self.policy = policy = policy or RoundPolicy()
        self.backend = backend
        self.transport = transport
        self.store = store
        self.run_id = run_id
        self.run_dir = Path(run_dir)
        policy.aggregation.check_backend(backend)
        self.personal = frozenset(personal)  # tensors that stay on the nodes: never sent back
        self.groups = model_groups(trainable.names())  # layer groups, None for toy models
        registrations = transport.register()
        self.sites: list[str] = list(registrations)
        self.pos_ratio = global_prevalence(registrations)
        backend.set_prevalence(self.pos_ratio)
        self.registrations = registrations
        sizes = {site: int(r["n"]) for site, r in registrations.items()}
        self.state: ServerState = backend.register_sites(
            backend.init_server(trainable, sizes), registrations
        )
        # [round, phase] of the last reply of each site kept in a committed round
        self.accepted: dict[str, list[int]] = {}
        self.committed_round: int | None = None  # last round in the store
        self.stopped: dict[str, Any] | None = None  # round and reason, if stopped early
        # called with each round's record after its checkpoint, before the round is recorded
        self.before_commit: Callable[[RoundRecord], None] | None = None
        # checkpoints and update signals, computed while the sites evaluate
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="background")
        self._checkpoint: Future[None] | None = None
        self.privacy: dict[str, tuple[float, float]] = {}  # site: last reported (ε, δ)
        self._secure = None  # secure aggregation's runner, after its refusals by name
        if policy.secure is not None:  # imported only then: it loads the cryptography libraries
            from fed_auc.coordinator.secure_phase import SecurePhase

            self._secure = SecurePhase.checked(
                policy.secure, self.policy.aggregation.method, policy.max_update_norm,
                backend, transport, registrations, personal, run_id,
            )  # fmt: skip

    # -- the loop -----------------------------------------------------------------------
    def run(
        self,
        rounds: int,
        on_round: Callable[[RoundRecord], None] | None = None,
        stop: Callable[[], str | None] | None = None,
    ) -> list[RoundRecord]:
        """Evaluate the initial model (round 0), then train until ``rounds`` rounds are done,
        or until ``stop()`` gives a reason after a round (early stopping; kept in
        ``stopped`` and the run's events).

        After ``resume`` only the rounds still missing are run. With ``eval_every`` = N only
        every N-th round and the last are evaluated (the others record no AUC): evaluating
        every site costs as much as a round of training when rounds are short.
        """
        results = [] if self.committed_round is not None else [self.evaluate_initial()]
        while self.state["round"] < rounds:
            upcoming = self.state["round"] + 1
            due = upcoming % self.policy.eval_every == 0 or upcoming == rounds
            try:
                results.append(self.run_round(evaluate=due))
            except BudgetsSpent as exc:  # the run ends with the rounds it has
                if upcoming == 1:  # nothing trained: no model to export as "completed"
                    raise FederationError(
                        f"round 1 trained nothing: {exc}. The planner sizes σ for the planned "
                        "rounds, so a budget spent at round 1 means the target ε is too small "
                        "for one round of this backend"
                    ) from exc
                self.store.add_event(self.run_id, str(exc), "warning", None, upcoming)
                break
            if on_round is not None:
                on_round(results[-1])
            reason = None if stop is None or upcoming == rounds else stop()
            if reason is not None:
                self.stopped = {"round": upcoming, "reason": reason}
                self.store.add_event(self.run_id, f"stopped after round {upcoming}: {reason}")
                break
        self.wait_for_checkpoint()
        return results

    def resume(self) -> int:
        """Continue from the store's last committed round: load its checkpoint. Returns it."""
        rounds = self.store.rounds(self.run_id)
        if rounds.empty:
            return -1  # not even round 0 was recorded: start over
        last = int(rounds["round"].max())
        snapshot = load_checkpoint(self.run_dir, last)
        self.state, self.accepted = snapshot["state"], snapshot["accepted"]
        self.committed_round = last
        rows = self.store.site_rounds(self.run_id).dropna(subset=["dp_epsilon"])
        for row in rows.itertuples():  # in round order: the last one stays
            self.privacy[row.site] = (float(row.dp_epsilon), float(row.dp_delta))
        return last

    def evaluate_initial(self) -> RoundRecord:
        record = RoundRecord(round=0, stage=0, lr=None)
        site_rows = {s: SiteRound(site=s, status="initial") for s in self.sites}
        self._start_checkpoint(0, {})
        self._evaluate(record, site_rows)
        self._finish_round(record, site_rows, {})
        return record

    def run_round(self, evaluate: bool = True) -> RoundRecord:
        """One round: every phase of the backend, then evaluation, record and checkpoint."""
        start = time.perf_counter()
        round_ = self.state["round"]
        record = RoundRecord(round=round_ + 1)
        rows = {s: SiteRound(site=s, status="idle") for s in self.sites}
        signal_jobs = []  # per phase: the sites' update signals, computed in the background
        kept: dict[str, list[int]] = {}  # this round's accepted replies, [round, phase]
        for index, phase in enumerate(self.backend.phases):
            policy = self.policy
            selected = sample_sites(self.sites, policy.participation, policy.seed, round_, phase)
            broadcast = self.backend.plan(self.state, round_, phase)
            broadcast.config["pos_ratio"] = self.pos_ratio
            if "local_steps" in broadcast.config:  # every site's τ_i, sampled or not
                steps = {site: self._local_steps(site, broadcast) for site in self.sites}
                self.state = self.backend.with_local_steps(self.state, steps)
            record.stage = broadcast.config.get("stage", record.stage)
            record.lr = broadcast.config.get("lr", record.lr)
            requests = {site: self._request_for(site, broadcast, kept) for site in selected}
            requests, sent = compressed_requests(broadcast, requests, self.policy.compress)
            if self._secure is not None:  # only sums reach the server: no per-site signals
                self.state, valid = self._secure_phase(phase, requests, rows, record, sent)
                kept.update({reply.site: [round_, index] for reply in valid})
                continue
            try:
                answers = self.transport.train(sent)
            except FederationError as exc:  # too few nodes replied (over Flower): say when
                raise FederationError(f"round {record.round} failed: {exc}") from None
            valid = self.screen(phase, answers, requests, rows, record, sent=sent)
            kept.update({reply.site: [round_, index] for reply in valid})
            if not valid:
                raise self.phase_failure(
                    phase, selected, rows, record, f"no valid reply from {selected}"
                )
            signal_jobs.append(self._writer.submit(phase_signals, broadcast.tensors, valid))
            blocks = [self.backend.reply_blocks(reply, requests[reply.site]) for reply in valid]
            robust = self.policy.aggregation.apply(valid, blocks)
            completed = [self.backend.complete_reply(r, requests[r.site]) for r in robust]
            for reply in completed:
                prefix = self.backend.control_delta_prefix
                if prefix is not None:
                    rows[reply.site].cv_drift = tensor_norm(reply.tensors, prefix)
            self.state = self.backend.aggregate(self.state, completed, phase)
        self._start_checkpoint(record.round, kept)
        if evaluate:
            self._evaluate(record, rows)
        else:
            record.metrics = {"eval_s": 0.0}
        phases = [job.result() for job in signal_jobs]
        for site, values in next((s for s in reversed(phases) if s), {}).items():
            for key, value in values.items():
                setattr(rows[site], key, value)
        for site, row in rows.items():  # ε spent so far, also where a site did not train
            if site in self.privacy:
                row.dp_epsilon, row.dp_delta = self.privacy[site]
                row.dp_relation = self.policy.dp_relation
        record.duration_s = time.perf_counter() - start
        self._finish_round(record, rows, kept)
        return record

    def _secure_phase(
        self,
        phase: str,
        requests: Mapping[str, Broadcast],
        rows: dict[str, SiteRound],
        record: RoundRecord,
        sent: Mapping[str, Broadcast],
    ) -> tuple[ServerState, list[Reply]]:
        """The phase as sums (``SecurePhase``), screened as the plain phase screens replies;
        a failed session ends the round with ``phase_failure``'s error. ``sent``: the
        requests as they travel (``--compress``)."""
        from fed_auc.privacy.secure.messages import SecureAggregationError

        def screen(answers, masked_requests, length: int) -> list[Reply]:
            return self.screen(phase, answers, masked_requests, rows, record, length)

        try:
            return self._secure.run(self.state, requests, rows, record, screen, sent)
        except SecureAggregationError as exc:
            raise self.phase_failure(phase, list(requests), rows, record, str(exc)) from exc

    def phase_failure(
        self,
        phase: str,
        selected: Sequence[str],
        rows: Mapping[str, SiteRound],
        record: RoundRecord,
        cause: str,
    ) -> FederationError:
        """Keep what the nodes said in a phase that fails, then say why it ends the run:
        ``BudgetsSpent`` when too few of the sites asked have privacy budget left to form an
        aggregate (none; under secure aggregation, fewer than its threshold)."""
        for site, level, message in record.events:
            self.store.add_event(self.run_id, message, level, site, record.round)
        spent = [s for s in selected if rows[s].status == "budget_spent"]
        needed = 1 if self._secure is None else self._secure.threshold_for(selected)
        if len(spent) == len(selected):
            return BudgetsSpent(
                f"round {record.round}: every site asked ({list(selected)}) has spent its "
                "privacy budget; training ends"
            )
        if spent and len(selected) - len(spent) < needed:
            return BudgetsSpent(
                f"round {record.round}: {spent} of the sites asked have spent their privacy "
                f"budget; the {len(selected) - len(spent)} left are fewer than secure "
                f"aggregation's threshold {needed}; training ends"
            )
        return FederationError(f"round {record.round}, phase {phase!r}: {cause}")

    # -- steps --------------------------------------------------------------------------
    def _request_for(
        self, site: str, broadcast: Broadcast, kept: Mapping[str, list[int]]
    ) -> Broadcast:
        """The broadcast as this site receives it: its own τ_i where there are local steps,
        and which of its replies the federation kept (for the node's local-state commit)."""
        config = {
            **broadcast.config,
            "commit": self.accepted.get(site),
            "continue": kept.get(site),
        }
        if "local_steps" in config:
            config["local_steps"] = self._local_steps(site, broadcast)
        return dataclasses.replace(broadcast, config=config)

    def _local_steps(self, site: str, broadcast: Broadcast) -> int:
        """τ_i of ``site`` in the broadcast's round: fixed, drawn or the backend's."""
        default = broadcast.config["local_steps"]
        if self.policy.local_work is None:
            return default
        return self.policy.local_work.steps(site, broadcast.round, default)

    def screen(
        self,
        phase: str,
        answers: Mapping[str, Reply | NodeFailure],
        requests: Mapping[str, Broadcast],
        rows: dict[str, SiteRound],
        record: RoundRecord,
        masked_length: int | None = None,
        sent: Mapping[str, Broadcast] | None = None,
    ) -> list[Reply]:
        """Validate every answer; record failures and rejections as events, keep the rest.
        ``masked_length``: secure aggregation's masked vectors (only their form is checked);
        ``sent``: the requests as they travelled, when compressed (``requests``: as the
        replies are read against)."""
        layout = self.backend.reply_layout(phase)
        sent = requests if sent is None else sent
        valid = []
        for site, answer in answers.items():
            if site not in requests:  # a transport must not invent answers
                record.events.append((site, "error", f"{phase}: answer from an unasked site"))
                continue
            row = rows[site]
            down = payload_bytes(sent[site].tensors)
            up = (payload_size(answer.tensors) or 0) if isinstance(answer, Reply) else 0
            row.metrics.setdefault("bytes", {})[phase] = {"down": down, "up": up}
            row.bytes_down = (row.bytes_down or 0) + down
            record.bytes_down += down
            if isinstance(answer, NodeFailure):
                row.status = answer.status
                level = "warning" if answer.status == "budget_spent" else "error"
                record.events.append((site, level, f"{phase}: {answer.status}: {answer.message}"))
                continue
            try:
                answer = decompressed(answer, requests[site], layout, self.policy.compress)
                validate_answer(
                    answer,
                    site,
                    requests[site],
                    layout,
                    self.policy.max_update_norm,
                    self.personal,
                    backend=self.backend,
                    registered_examples=int(self.registrations[site]["n"]),
                    masked_length=masked_length,
                )
            except InvalidReply as exc:
                row.status = "rejected"
                record.events.append((site, "error", f"{phase}: rejected: {exc}"))
                continue
            row.bytes_up = (row.bytes_up or 0) + up
            record.bytes_up += up
            if row.status in ("idle", "completed"):
                row.status = "completed"
            row.steps = (row.steps or 0) + answer.steps
            row.trained_groups = answer.trained_groups or self.groups
            row.n = answer.num_examples
            row.positives = self.registrations[site]["positives"]
            row.train_loss = answer.metrics.get("train_loss", row.train_loss)
            compute = {k: answer.metrics[k] for k in COMPUTE_METRICS if k in answer.metrics}
            if compute:  # with the device and precision the site registered (last phase's)
                declared = {k: self.registrations[site].get(k) for k in ("device", "precision")}
                row.metrics["compute"] = {**declared, **compute}
            if "dp_epsilon" in answer.metrics:  # DP-SGD: the site's ε and its own σ
                self.privacy[site] = (answer.metrics["dp_epsilon"], answer.metrics["dp_delta"])
                row.metrics["dp_noise_multiplier"] = answer.metrics.get("dp_noise_multiplier")
            valid.append(answer)
        return valid

    def _evaluate(self, record: RoundRecord, rows: dict[str, SiteRound]) -> None:
        """Every site scores the global model; pooled test AUC when scores may leave."""
        start = time.perf_counter()
        model = self.backend.global_tensors(self.state)
        answers = self.transport.evaluate(self.sites, model, pooled=self.policy.pooled_scoring)
        per_label = record_scores(answers, record, rows)
        record.metrics = {
            "global_auc_per_label": per_label,
            "eval_s": time.perf_counter() - start,
        }

    def _start_checkpoint(self, round_: int, kept: Mapping[str, list[int]]) -> None:
        """Write the round's checkpoint in the background while the sites evaluate.

        Backends never modify a state in place, so the saved dicts stay as they were.
        """
        self.wait_for_checkpoint()
        snapshot = {"round": round_, "state": self.state, "accepted": {**self.accepted, **kept}}
        self._checkpoint = self._writer.submit(write_checkpoint, snapshot, self.run_dir)

    def _finish_round(
        self, record: RoundRecord, rows: dict[str, SiteRound], kept: Mapping[str, list[int]]
    ) -> None:
        """Commit the round: its checkpoint on disk first, then its rows in one transaction."""
        self.wait_for_checkpoint()
        record.sites = list(rows.values())
        if self.before_commit is not None:
            self.before_commit(record)
        self.store.record_round(self.run_id, record)
        self.accepted.update(kept)
        self.committed_round = record.round

    def wait_for_checkpoint(self) -> None:
        """Block until the last checkpoint is on disk; re-raise its error if it failed."""
        if self._checkpoint is not None:
            self._checkpoint.result()
            self._checkpoint = None

    def close(self) -> None:
        self.wait_for_checkpoint()
        self._writer.shutdown()
