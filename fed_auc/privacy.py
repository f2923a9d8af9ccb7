"""Client-side differential privacy: clip a node's update, add Gaussian noise, then reply.

The Gaussian mechanism of DP-FedAvg (McMahan et al., 2018), applied on the node so the
noise is added before anything leaves the hospital. Each block of the reply
(``Backend.reply_blocks``) is clipped and noised as the move it makes the model take: an
iterate as its change from the broadcast model (Δ = w_k − w), a gradient block (FedSGDA's
full gradients, Fed-Norm-SGDA's normalized ones) as ``rate · g``, the rates of the steps that
apply it. So C means the same for every backend (how far one site may move the model in a
round), and the clipped move is mapped back to the block's units (dividing by a public rate
is post-processing: no privacy cost). A move of norm > C is scaled to C, then N(0, (σ·C)²)
is added to every coordinate. Buffers (BatchNorm statistics) are sent as they are. The noise
is seeded per (run seed, site, round, phase), so a resumed run draws the same noise as an
uninterrupted one. The accounting (ε, δ over rounds) is not done here: the run records C, σ.

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

import torch

from fed_auc.algorithms.base import Broadcast, Reply, ReplyBlock, validate_positive


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
        self, reply: Reply, broadcast: Broadcast, site: str, blocks: Sequence[ReplyBlock]
    ) -> Reply:
        """The reply with every block's move clipped to C and noised (``blocks``: the reply's
        ``Backend.reply_blocks``); buffers and counts as they are."""
        generator = torch.Generator().manual_seed(
            _seed(f"{self.seed}:{site}:{broadcast.round}:{broadcast.phase}")
        )
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
