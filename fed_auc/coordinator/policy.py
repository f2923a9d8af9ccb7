"""How a coordinator runs each round, apart from what it runs on: who takes part, how much each
site works, which replies it accepts and how it averages them, when it evaluates, and what may
leave the sites. One value, so the coordinator's constructor takes what it runs on plus this."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fed_auc.coordinator.local_work import LocalWork
from fed_auc.coordinator.robust import Aggregation
from fed_auc.exchange.compression import check_mode

COMPRESS_WITH_SECURE = (
    "compress int8 and secure_aggregation cannot be combined: a masked vector's fixed point "
    "would need 16-bit words, whose 8 fraction bits are coarser than a typical update; use "
    "compress fp16 (32-bit words) with secure aggregation"
)


@dataclass(frozen=True)
class RoundPolicy:
    """``participation``: the fraction of sites sampled per round (seeded by ``seed``);
    ``local_work``: per-site τ_i (None: the backend's local steps); ``eval_every``: rounds
    between evaluations (round 0 and the last always); ``max_update_norm`` and
    ``aggregation``: which replies are accepted and how they are averaged; ``secure``: a
    ``SecureAggregation`` (fed_auc.coordinator.secure_phase), the coordinator then learns only
    sums of replies; ``compress``: how train requests and replies travel (none, fp16,
    int8: ``fed_auc.exchange.compression``); ``pooled_scoring``: whether per-image validation
    scores may leave the sites; ``dp_relation``: the neighbouring relation the sites' ε are
    for, recorded beside each ε."""

    participation: float = 1.0
    seed: int = 0
    local_work: LocalWork | None = None
    eval_every: int = 1
    max_update_norm: float | None = None
    aggregation: Aggregation = dataclasses.field(default_factory=Aggregation)
    secure: Any = None
    pooled_scoring: bool = True
    dp_relation: str | None = None
    compress: str = "none"

    def __post_init__(self) -> None:
        if not 0 < self.participation <= 1:
            raise ValueError(f"participation must be in (0, 1], got {self.participation!r}")
        every = self.eval_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"eval_every must be an integer >= 1, got {every!r}")
        check_mode(self.compress)
        if self.compress == "int8" and self.secure is not None:
            raise ValueError(COMPRESS_WITH_SECURE)
