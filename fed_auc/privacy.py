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
why an accounted run has none (GroupNorm). The noise is seeded by the release's key
(``accounting.release_key``), so a resumed run draws the same noise as an uninterrupted one
and another update for the same round draws fresh noise.

Site-level accounting (``PrivateUpdates``; Google's ``dp-accounting``, never a hand-written
bound). The neighbouring relation is the whole site: add or remove one hospital's dataset.
Each block's clipped move has sensitivity C (the site's move against no move) and carries
N(0, (σC)²) noise, so one update of b blocks is one Gaussian mechanism of noise multiplier
σ/√b (b Gaussians of sensitivity C compose to one of sensitivity C·√b); a round of several
phases composes its updates. The sampling rate is q = 1, no amplification: the coordinator
picks a fixed number of sites without replacement from a generator seeded by the run's seed
(``coordinator.sample_sites``), so whoever sees the replies knows which sites were asked;
subsampling amplifies only a sample that stays secret and, in dp-accounting's RDP, Poisson
sampling under add/remove. A site pays for the rounds it takes part in and nothing else.
This ε protects a whole hospital's data, not one patient's more than that; with few sites
the σ a small ε needs is large against the signal (the mean of the sites' moves).

CODASCA's Δc^k does not travel: the server derives it from the (privatized) iterate and the
broadcast, and the node, told what it sent (``Backend.reply_sent``), derives its own c^k from
the same privatized iterate, so c stays the mean of the c^k (post-processing: no privacy cost).
A clip that binds at the saddle point moves the fixed point: gradient blocks do not vanish
there under heterogeneity (BENCHMARKS.md, "Saddle-point fidelity").
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from fed_auc.accounting import PrivacyLedger, Step, check_delta, noise_for_epsilon, release_key
from fed_auc.algorithms.base import Broadcast, Reply, ReplyBlock, validate_positive

DATA_METRICS = ("train_loss",)  # computed from the raw batches: never sent by a private site


@dataclass(frozen=True)
class Privacy:
    """Clip norm C and noise multiplier σ (σ = 0: clipping only)."""

    clip: float
    noise_multiplier: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        validate_positive("dp_clip", self.clip)
        validate_positive("dp_noise", self.noise_multiplier, allow_zero=True)

    def privatize(
        self,
        reply: Reply,
        broadcast: Broadcast,
        site: str,
        blocks: Sequence[ReplyBlock],
        key: str | None = None,
    ) -> Reply:
        """The reply with every block's move clipped to C and noised (``blocks``: the reply's
        ``Backend.reply_blocks``); buffers and counts as they are. ``key``: the release's key,
        which seeds the noise (None: seed, site, round and phase, for callers that count no ε)."""
        key = key or f"{self.seed}:{site}:{broadcast.round}:{broadcast.phase}"
        generator = torch.Generator().manual_seed(_seed(key))
        tensors = dict(reply.tensors)
        for block in blocks:
            move = block.move(tensors)
            norm = math.sqrt(sum(float(m.pow(2).sum()) for m in move.values()))
            scale = min(1.0, self.clip / norm) if norm > 0 else 1.0
            noised = {}
            for n, m in move.items():
                noise = torch.randn(m.shape, generator=generator, dtype=tensors[n].dtype)
                noised[n] = m * scale + noise.double() * (self.noise_multiplier * self.clip)
            tensors.update(block.tensors_for(noised, tensors))
        return dataclasses.replace(reply, tensors=tensors, metrics=dict(reply.metrics))


def _seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


@dataclass(frozen=True)
class UpdateDP:
    """Update-level DP's settings: clip C, noise multiplier σ (or a target ε to derive it
    from), δ, and the releases the calibration plans for (rounds × phases: a site may take
    part in every round). σ = 0 without a target is clipping only: no guarantee, no ε."""

    clip: float
    noise_multiplier: float = 0.0
    delta: float = 1e-5
    target_epsilon: float | None = None
    planned_releases: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        validate_positive("dp_clip", self.clip)
        validate_positive("dp_noise", self.noise_multiplier, allow_zero=True)
        check_delta(self.delta)
        if self.target_epsilon is not None:
            validate_positive("target_epsilon", self.target_epsilon)
            if self.noise_multiplier:
                raise ValueError(
                    "dp = 'update' takes dp_noise (σ) or target_epsilon (ε), not both: got "
                    f"dp_noise={self.noise_multiplier!r}, target_epsilon={self.target_epsilon!r}"
                )
        if int(self.planned_releases) != self.planned_releases or self.planned_releases < 1:
            raise ValueError(
                f"planned_releases must be an integer ≥ 1, got {self.planned_releases!r}"
            )

    @property
    def accounted(self) -> bool:
        """Whether an accountant runs: there is noise (or a target ε to derive it from)."""
        return bool(self.noise_multiplier) or self.target_epsilon is not None

    def sigma(self) -> float:
        """σ: the given one, or calibrated by dp-accounting so that ``planned_releases``
        Gaussian mechanisms (q = 1) spend ``target_epsilon`` at ``delta``."""
        if self.target_epsilon is None:
            return self.noise_multiplier
        return noise_for_epsilon(self.target_epsilon, self.delta, 1.0, self.planned_releases)


class PrivateUpdates:
    """A node's update-level DP: the mechanism, and (with noise) its site-level ledger and
    budget, so every update is counted before it leaves or is not sent at all."""

    def __init__(self, dp: UpdateDP, site: str, state_dir: str | Path) -> None:
        self.dp, self.site = dp, site
        self.sigma = dp.sigma()
        self.mechanism = Privacy(dp.clip, self.sigma, dp.seed)
        self.ledger = PrivacyLedger(state_dir, dp.delta) if dp.accounted else None

    def check_open(self) -> None:
        """Raise ``BudgetSpent`` if an earlier round found the budget spent."""
        if self.ledger is not None:
            self.ledger.check_open(self.dp.target_epsilon)

    def release_key(self, broadcast: Broadcast, sampler: dict) -> str:
        """The key of the update this broadcast asks for (``sampler``: the state it starts
        from)."""
        return release_key(self.dp.seed, self.site, broadcast, sampler)

    def release(
        self, reply: Reply, broadcast: Broadcast, blocks: Sequence[ReplyBlock], key: str
    ) -> Reply:
        """The reply clipped and noised, counted in the ledger first; ``BudgetSpent`` (nothing
        sent) when it would pass the target."""
        if self.ledger is None:  # clipping only: nothing to account
            return self.mechanism.privatize(reply, broadcast, self.site, blocks)
        steps = [Step(1.0, self.sigma / math.sqrt(len(blocks)))] if blocks else []
        self.ledger.spend(key, broadcast.round, broadcast.phase, steps, self.dp.target_epsilon)
        sent = self.mechanism.privatize(reply, broadcast, self.site, blocks, key)
        metrics = {k: v for k, v in sent.metrics.items() if k not in DATA_METRICS}
        metrics.update(
            dp_epsilon=self.ledger.epsilon(),
            dp_delta=self.dp.delta,
            dp_noise_multiplier=self.sigma,
        )
        return dataclasses.replace(sent, metrics=metrics)
