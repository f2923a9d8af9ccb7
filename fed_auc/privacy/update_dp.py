"""Client-side differential privacy: clip a node's update, add Gaussian noise, then reply.

The Gaussian mechanism of DP-FedAvg (McMahan et al., 2018), applied on the node so the
noise is added before anything leaves the hospital. Each block of the reply
(``Backend.reply_blocks``) is clipped and noised as the move it makes the model take: an
iterate as its change from the broadcast model (Δ = w_k − w), a gradient block (FedSGDA's
full gradients, Fed-Norm-SGDA's normalized ones) as ``rate · g``, the rates of the steps that
apply it. So C means the same for every backend (how far one site may move the model in a
round), and the clipped move is mapped back to the block's units (dividing by a public rate
is post-processing: no privacy cost). A move of norm > C is scaled to C, then N(0, (σ·C)²)
is added to every coordinate. Buffers (BatchNorm statistics) are sent as they are, which is
why an accounted run has none (GroupNorm). The noise is drawn from the node's own secret
(``accounting.NodeSecret``) keyed by the release (``accounting.release_key``): a resumed run
draws the same noise as an uninterrupted one on that node, another computation draws fresh
noise, and nobody without the secret (the coordinator included) can regenerate it.

Site-level accounting (``PrivateUpdates``; Google's ``dp-accounting``, never a hand-written
bound). The neighbouring relation is replacing one hospital's whole training data: which
sites replied is public, so the relation the noise can hide is "this hospital's data vs other
data", not "vs none". Two clipped moves differ by up to 2C, so each block is a Gaussian of
sensitivity 2C and multiplier σ/2, and an update of b blocks is one Gaussian mechanism of
multiplier σ/(2√b); a round of several phases composes its updates. The sampling rate is
q = 1, no amplification: the coordinator picks a fixed number of sites without replacement
from a generator seeded by the run's seed (``coordinator.sample_sites``), so whoever sees the
replies knows which sites were asked. A site pays for the rounds it takes part in and
nothing else. This ε protects a whole hospital's data, not one patient's more than that;
with few sites the σ a small ε needs is large against the signal (the mean of the moves).

CODASCA's Δc^k does not travel: the server derives it from the (privatized) iterate and the
broadcast, and the node, told what it sent (``Backend.reply_sent``), derives its own c^k from
the same privatized iterate, so c stays the mean of the c^k (post-processing: no privacy cost).
A clip that binds at the saddle point moves the fixed point: gradient blocks do not vanish
there under heterogeneity (BENCHMARKS.md, "Saddle-point fidelity").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from fed_auc.algorithms.base import ReplyBlock, validate_positive
from fed_auc.exchange import Broadcast, Reply
from fed_auc.privacy.accounting import (
    UPDATE_SENSITIVITY,
    NodeSecret,
    PrivacyLedger,
    Step,
    check_delta,
    check_plan,
    noise_for_plan,
    update_plan,
)

DATA_METRICS = ("train_loss",)  # computed from the raw batches: never sent by a private site


@dataclass(frozen=True)
class Privacy:
    """Clip norm C and noise multiplier σ (σ = 0: clipping only)."""

    clip: float
    noise_multiplier: float = 0.0

    def __post_init__(self) -> None:
        validate_positive("dp_clip", self.clip)
        validate_positive("dp_noise", self.noise_multiplier, allow_zero=True)

    def privatize(
        self,
        reply: Reply,
        blocks: Sequence[ReplyBlock],
        generator: torch.Generator | None = None,
    ) -> Reply:
        """The reply with every block's move clipped to C and noised (``blocks``: the reply's
        ``Backend.reply_blocks``); buffers and counts as they are. ``generator``: where the
        noise is drawn from (the node's secret, keyed by the release); needed when σ > 0."""
        if self.noise_multiplier and generator is None:
            raise ValueError("noised update-level DP needs the node's noise generator")
        tensors = dict(reply.tensors)
        for block in blocks:
            move = block.move(tensors)
            norm = math.sqrt(sum(float(m.pow(2).sum()) for m in move.values()))
            scale = min(1.0, self.clip / norm) if norm > 0 else 1.0
            noised = {}
            for n, m in move.items():
                noised[n] = m * scale
                if self.noise_multiplier:
                    noise = torch.randn(m.shape, generator=generator, dtype=tensors[n].dtype)
                    noised[n] = noised[n] + noise.double() * (self.noise_multiplier * self.clip)
            tensors.update(block.tensors_for(noised, tensors))
        return dataclasses.replace(reply, tensors=tensors, metrics=dict(reply.metrics))


@dataclass(frozen=True)
class UpdateDP:
    """Update-level DP's settings: clip C, noise multiplier σ and/or a target ε, δ, and the
    rounds the planner plans for (each phase of each round one release: a site may take part
    in every round). σ = 0 without a target is clipping only: no guarantee, no ε. Both σ and
    ε: σ as given, and a plan that needs more than ε is refused before round 1."""

    clip: float
    noise_multiplier: float = 0.0
    delta: float = 1e-5
    target_epsilon: float | None = None
    rounds: int = 1

    def __post_init__(self) -> None:
        validate_positive("dp_clip", self.clip)
        validate_positive("dp_noise", self.noise_multiplier, allow_zero=True)
        check_delta(self.delta)
        if self.target_epsilon is not None:
            validate_positive("target_epsilon", self.target_epsilon)
        if isinstance(self.rounds, bool) or int(self.rounds) != self.rounds or self.rounds < 1:
            raise ValueError(f"DP planning: rounds must be an integer ≥ 1, got {self.rounds!r}")

    @property
    def accounted(self) -> bool:
        """Whether an accountant runs: there is noise (or a target ε to derive it from)."""
        return bool(self.noise_multiplier) or self.target_epsilon is not None


class PrivateUpdates:
    """A node's update-level DP: the mechanism, and (with noise) its plan, site-level ledger
    and budget, so every update is counted before it leaves or is not sent at all.
    ``blocks_per_release``: the blocks of each phase's reply (``Backend.reply_layout``)."""

    def __init__(
        self,
        dp: UpdateDP,
        site: str,
        state_dir: str | Path,
        secret: NodeSecret | None,
        blocks_per_release: Sequence[int],
    ) -> None:
        self.dp, self.site, self.secret = dp, site, secret
        self.plan = update_plan(blocks_per_release, dp.rounds)
        self.sigma = dp.noise_multiplier
        self.planned_epsilon: float | None = None
        self.ledger = None
        if dp.accounted:
            if not self.sigma:
                self.sigma = noise_for_plan(dp.target_epsilon, dp.delta, self.plan)
            self.planned_epsilon = check_plan(
                self.plan, self.sigma, dp.delta, dp.target_epsilon, site, dp.rounds
            )
            self.ledger = PrivacyLedger(state_dir, dp.delta)
        self.mechanism = Privacy(dp.clip, self.sigma)

    def check_open(self) -> None:
        """Raise ``BudgetSpent`` if an earlier round found the budget spent."""
        if self.ledger is not None:
            self.ledger.check_open(self.dp.target_epsilon)

    def release(
        self, reply: Reply, broadcast: Broadcast, blocks: Sequence[ReplyBlock], key: str
    ) -> Reply:
        """The reply clipped and noised, counted in the ledger first; ``BudgetSpent`` (nothing
        sent) when it would pass the target. ``key``: the release (``accounting.release_key``)."""
        if self.ledger is None:  # clipping only: nothing to account
            return self.mechanism.privatize(reply, blocks)
        multiplier = self.sigma / (UPDATE_SENSITIVITY * math.sqrt(len(blocks)))
        steps = [Step(1.0, multiplier)] if blocks else []
        self.ledger.spend(key, broadcast.round, broadcast.phase, steps, self.dp.target_epsilon)
        generator = torch.Generator().manual_seed(self.secret.seed("noise", key))
        sent = self.mechanism.privatize(reply, blocks, generator)
        metrics = {k: v for k, v in sent.metrics.items() if k not in DATA_METRICS}
        metrics.update(
            dp_epsilon=self.ledger.epsilon(),
            dp_delta=self.dp.delta,
            dp_noise_multiplier=self.sigma,
        )
        return dataclasses.replace(sent, metrics=metrics)
