"""Client-side differential privacy: clip a node's update, add Gaussian noise, then reply.

The Gaussian mechanism of DP-FedAvg (McMahan et al., 2018), applied on the node so the
noise is added before anything leaves the hospital. Each block of the reply is treated
separately: the model iterate as its change from the broadcast model (Δ = w_k − w), every
other block (FedSGDA's gradients...) as it is. A block is scaled to L2 norm ≤ C, then
N(0, (σ·C)²) is added to every coordinate. The noise is seeded per
(run seed, site, round, phase), so a resumed run draws the same noise as an uninterrupted one.
The accounting (ε, δ over rounds) is not done here: the run records C and σ.

CODASCA's Δc^k does not travel: the server derives it from the (privatized) iterate and the
broadcast, and the node, told what it sent (``Backend.reply_sent``), derives its own c^k from
the same privatized iterate, so c stays the mean of the c^k (post-processing: no privacy cost).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass

import torch

from fed_auc.algorithms.base import Broadcast, Reply, validate_positive
from fed_auc.trainable import AUC, BUFFER, WEIGHT, Tensors


@dataclass(frozen=True)
class Privacy:
    """Clip norm C and noise multiplier σ (σ = 0: clipping only)."""

    clip: float
    noise_multiplier: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        validate_positive("dp_clip", self.clip)
        validate_positive("dp_noise", self.noise_multiplier, allow_zero=True)

    def privatize(self, reply: Reply, broadcast: Broadcast, site: str) -> Reply:
        """The reply with every block clipped and noised; buffers (BN statistics) as they are."""
        generator = torch.Generator().manual_seed(
            _seed(f"{self.seed}:{site}:{broadcast.round}:{broadcast.phase}")
        )
        tensors = dict(reply.tensors)
        for names in _blocks(tensors).values():
            base = {n: broadcast.tensors[n] for n in names if n in broadcast.tensors}
            if len(base) != len(names):  # not an iterate of the model: privatize it as it is
                base = {}
            delta = {n: tensors[n] - base[n] if base else tensors[n] for n in names}
            norm = math.sqrt(sum(float(d.double().pow(2).sum()) for d in delta.values()))
            scale = min(1.0, self.clip / norm) if norm > 0 else 1.0
            for n, d in delta.items():
                noise = torch.randn(d.shape, generator=generator, dtype=d.dtype)
                noised = d * scale + noise * (self.noise_multiplier * self.clip)
                tensors[n] = base[n] + noised if base else noised
        return dataclasses.replace(reply, tensors=tensors, metrics=dict(reply.metrics))


def _blocks(tensors: Tensors) -> dict[str, list[str]]:
    """Float tensors grouped by reply prefix (``""`` = the iterate); buffers excluded."""
    blocks: dict[str, list[str]] = {}
    for name, tensor in tensors.items():
        if name.startswith(BUFFER) or not tensor.is_floating_point():
            continue
        prefix = "" if name.startswith((WEIGHT, AUC)) else name.split("/", 1)[0] + "/"
        blocks.setdefault(prefix, []).append(name)
    return blocks


def _seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
