"""One phase of a round under secure aggregation, for any transport.

The coordinator's plain phase is: train → screen every reply → aggregate the replies. Here:
advertise keys (with the weights the sites check) → reveal the graph nonces → share keys →
train (each request carries the site's encrypted shares, the site masks its reply) → screen
each reply's envelope and counts (its values are masked) → unmask the sum →
``Backend.aggregate_secure``. Every step goes through the transport's ``secure(step,
messages)`` or ``train(requests)``, so in-process and Flower runs execute the same code and
record the same rows. A site that fails a step is left out of the next ones (its row and an
event say so); fewer than the threshold at any step fails the round with
``SecureAggregationError`` before anything is recorded.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fed_auc.algorithms.base import Backend, ServerState, model_part
from fed_auc.exchange import Broadcast, NodeFailure, Reply, Transport
from fed_auc.exchange.compression import COMPRESS_KEY
from fed_auc.privacy.secure.encoding import (
    MASKED,
    PLAIN,
    SecureSum,
    Words,
    site_weights_for,
    vector_layout,
    vector_length,
    words_for,
)
from fed_auc.privacy.secure.graph import neighbour_count
from fed_auc.privacy.secure.messages import CONFIG_KEY, SecureAggregationError
from fed_auc.privacy.secure.server import SecureServer, default_threshold
from fed_auc.store.records import RoundRecord, SiteRound

# Options that need one site's update, refused with secure aggregation (name → why).
REFUSED_OPTIONS = {
    "aggregation": "centered_clip clips each reply around the median of the replies; the "
    "server sees only their sum",
    "max_update_norm": "the server sees only the sum, never one reply's norm, and a node "
    "cannot prove that its masked reply is within the bound",
}


def refuse_options(aggregation: str, max_update_norm: float | None, backend: Backend) -> None:
    """Refuse, by name and with the reason, what needs one site's reply."""
    if aggregation != "mean":
        raise ValueError(
            f"aggregation {aggregation!r} cannot be used with secure_aggregation: "
            f"{REFUSED_OPTIONS['aggregation']}"
        )
    if max_update_norm is not None:
        raise ValueError(
            f"max_update_norm cannot be used with secure_aggregation: "
            f"{REFUSED_OPTIONS['max_update_norm']}"
        )
    SecureAggregation.check_backend(backend)


@dataclass(frozen=True)
class SecureAggregation:
    """Secure aggregation of every phase (SecAgg+): ``neighbours`` = k, the sites each site
    masks and shares with (None: ``graph.neighbour_count``'s 2⌈log₂ n⌉, the full graph up to 7
    sampled sites); ``threshold`` = shares that rebuild a site's secrets, from its
    neighbourhood (None: a majority of the site and its k neighbours, at least 2)."""

    threshold: int | None = None
    neighbours: int | None = None

    def __post_init__(self) -> None:
        t = self.threshold
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 2):
            raise ValueError(f"secure_aggregation_threshold must be an integer ≥ 2, got {t!r}")
        k = self.neighbours
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 2):
            raise ValueError(f"secure_aggregation_neighbours must be an integer ≥ 2, got {k!r}")

    @staticmethod
    def check_backend(backend: Backend) -> None:
        """Refuse, by name, a backend whose aggregate needs individual replies."""
        if type(backend).aggregate_secure is Backend.aggregate_secure:
            raise ValueError(
                f"secure_aggregation cannot be used with {backend.name!r}: its aggregation "
                "needs individual replies, not their sum"
            )

    def neighbours_for(self, sites: Sequence[str]) -> int:
        """k on the graph of ``sites`` (``SecureAggregationError`` for an odd k below n − 1)."""
        return neighbour_count(len(sites), self.neighbours)

    def threshold_for(self, sites: Sequence[str]) -> int:
        if self.threshold is not None:
            return self.threshold
        return default_threshold(self.neighbours_for(sites) + 1)


class SecurePhase:
    """Runs one phase of the coordinator's rounds securely."""

    def __init__(
        self,
        settings: SecureAggregation,
        backend: Backend,
        transport: Transport,
        registrations: Mapping[str, Mapping[str, Any]],
        excluded: Collection[str],
        run_id: str,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.transport = transport
        self.weights, self.unit = site_weights_for(backend, registrations)
        self.excluded = sorted(excluded)
        self.run_id = run_id

    @classmethod
    def checked(
        cls,
        settings: SecureAggregation,
        aggregation: str,
        max_update_norm: float | None,
        *args: Any,
    ) -> SecurePhase:
        """After refusing, by name, the options that need one site's reply; ``args`` as for
        the constructor after ``settings``."""
        refuse_options(aggregation, max_update_norm, args[0])
        return cls(settings, *args)

    def threshold_for(self, sites: Sequence[str]) -> int:
        """Sites a sum of ``sites``' replies needs."""
        return self.settings.threshold_for(sites)

    def run(
        self,
        state: ServerState,
        requests: Mapping[str, Broadcast],
        rows: dict[str, SiteRound],
        record: RoundRecord,
        screen: Callable[..., list[Reply]],
        sent: Mapping[str, Broadcast] | None = None,
    ) -> tuple[ServerState, list[Reply]]:
        """The new server state and the replies in the sum (``SecureAggregationError`` when
        fewer than the threshold take part in a step). ``screen(answers, requests,
        masked_length)``: the coordinator's check of envelopes and counts, returning the valid
        replies. ``sent``: the requests as they travel (``--compress``), ``requests`` with the
        exact model, which the sites' summed updates are added to."""
        any_request = next(iter(requests.values()))
        sent = requests if sent is None else sent
        compress = next(iter(sent.values())).config.get(COMPRESS_KEY, "none")
        form = words_for(compress)
        phase = any_request.phase
        sites = list(requests)
        server = SecureServer(
            f"{self.run_id}:{any_request.round}:{phase}",
            sites,
            self.settings.threshold_for(sites),
            self.settings.neighbours_for(sites),
            {site: self.weights[site] for site in sites},
            self.unit,
        )
        answers = self._step("advertise", server.advertise_requests(), rows, record, phase)
        self._events(server.collect_keys(answers), record, phase)
        server.collect_reveals(self._step("reveal", server.reveal_requests(), rows, record, phase))
        answers = self._step("share", server.share_requests(), rows, record, phase)
        self._events(server.collect_shares(answers), record, phase)
        masked_requests = {}
        for site in server.sharers:
            config = {
                **server.mask_config(site),
                "weight": self.weights[site],
                "excluded": self.excluded,
            }
            self._count(rows[site], record, phase, down=_size(config))
            request = sent[site]
            masked_requests[site] = dataclasses.replace(
                request, config={**request.config, CONFIG_KEY: config}
            )
        layout = vector_layout(self.backend, any_request, self.excluded)
        train_answers = self.transport.train(masked_requests)
        valid = screen(train_answers, masked_requests, vector_length(layout))
        survivors = [reply.site for reply in valid]
        answers = self._step("unmask", server.unmask_requests(survivors), rows, record, phase)
        vectors = {r.site: r.tensors[MASKED].numpy().view(form.dtype) for r in valid}
        try:
            words = server.unmask(vectors, answers)
        finally:
            self._events(server.problems, record, phase)
        self._check_weight(words, survivors, server.session, form)
        base = None if compress == "none" else model_part(any_request.tensors)
        total = SecureSum.decode(words, layout, self.unit, survivors, form, base)
        return self.backend.aggregate_secure(state, total, phase), valid

    def _check_weight(
        self, words: Any, survivors: Sequence[str], session: str, form: Words = PLAIN
    ) -> None:
        """The sum's last word is Σ π_k over the survivors, all public: exactly that in
        Z_{2^64}, or something (a share, a vector, a wrap-around) corrupted the sum, which is
        then refused rather than decoded into noise."""
        weights = np.asarray([self.weights[s] for s in survivors])
        expected = form.to_field(weights).sum(dtype=form.dtype)
        if words[-1] != expected:
            raise SecureAggregationError(
                f"secure aggregation of session {session}: the unmasked total weight "
                f"{form.from_field(words[-1:])[0]:.6g} is not the survivors' "
                f"{form.from_field(np.asarray([expected], dtype=form.dtype))[0]:.6g}: the sum is "
                "corrupted; refusing it"
            )

    def _step(
        self,
        step: str,
        messages: Mapping[str, dict[str, Any]],
        rows: dict[str, SiteRound],
        record: RoundRecord,
        phase: str,
    ) -> dict[str, Any]:
        """Send one step's messages; failures are recorded, the answers returned."""
        answers = self.transport.secure(step, messages)
        kept = {}
        for site, answer in answers.items():
            if site not in messages:
                continue
            if isinstance(answer, NodeFailure):
                if step != "unmask":  # after unmask's request its reply is in the sum
                    rows[site].status = answer.status
                record.events.append(
                    (site, "error", f"{phase}: secure aggregation {step}: {answer.status}: "
                     f"{answer.message}")
                )  # fmt: skip
                continue
            self._count(rows[site], record, phase, _size(messages[site]), _size(answer))
            kept[site] = answer
        return kept

    @staticmethod
    def _count(row: SiteRound, record: RoundRecord, phase: str, down: int, up: int = 0) -> None:
        """Protocol bytes (keys, shares) beside the payload's, per site and phase."""
        row.bytes_down = (row.bytes_down or 0) + down
        row.bytes_up = (row.bytes_up or 0) + up
        record.bytes_down += down
        record.bytes_up += up
        spent = row.metrics.setdefault("secure_aggregation_bytes", {}).setdefault(
            phase, {"down": 0, "up": 0}
        )
        spent["down"] += down
        spent["up"] += up

    @staticmethod
    def _events(problems: list[str], record: RoundRecord, phase: str) -> None:
        for problem in problems:
            record.events.append((None, "error", f"{phase}: secure aggregation: {problem}"))


def _size(message: Any) -> int:
    return len(json.dumps(message).encode())


__all__ = [
    "REFUSED_OPTIONS",
    "SecureAggregation",
    "SecureAggregationError",
    "SecurePhase",
    "refuse_options",
]
