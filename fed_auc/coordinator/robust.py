"""Robust aggregation that keeps the objective: clipping each reply around a robust centre.

``centered_clip:τ`` (after Karimireddy, He and Jaggi, ICML 2021, "Learning from history for
Byzantine robust optimization"): for every block of the replies (``Backend.reply_blocks``,
measured as the move it makes the model take, so τ means the same for every backend), the
centre is the coordinate-wise median of the replies' moves; a reply whose move lies farther
than τ from the centre is pulled onto the sphere of radius τ around it, in its own direction.
Then the backend aggregates as always (its own weights, control variates, partial training).
So a reply within τ of the centre is averaged exactly as under ``mean``: with every honest
site's move within τ, the run converges to the saddle point of the mean objective, and any
one reply, hostile or not, moves the aggregate by at most its weight times (τ + the centre's
distance to the mean). Karimireddy et al. iterate the clipping from the previous aggregate;
starting from the median instead keeps the step stateless (a resumed run and a Flower run do
exactly the same). The move of a clipped reply is mapped back to the block's units.
CODASCA refuses it (``Backend.refuses_robust_aggregation``: the server would derive a Δc^k
its node does not hold).

Coordinate-wise ``median`` and ``trimmed_mean`` are refused: under heterogeneous sites they
converge where the median of the sites' gradients vanishes, not the mean, 0.19–0.99 from the
saddle point on the toy (BENCHMARKS.md, "Saddle-point fidelity"), and they break CODASCA's
c = mean_k c^k.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from fed_auc.algorithms.base import Backend, ReplyBlock
from fed_auc.exchange import Reply

AGGREGATIONS = ("mean", "centered_clip")
REFUSED = {
    "median": "the coordinate-wise median",
    "trimmed_mean": "a coordinate-wise trimmed mean",
}


@dataclasses.dataclass(frozen=True)
class Aggregation:
    """``mean`` (the backend's own) or ``centered_clip`` with radius τ (model-move units)."""

    method: str = "mean"
    radius: float | None = None

    def __post_init__(self) -> None:
        if self.method in REFUSED:
            raise ValueError(
                f"aggregation {self.method!r} is not offered: {REFUSED[self.method]} of "
                "heterogeneous sites' updates converges where the median of their gradients "
                "vanishes, not to the saddle point of the federation's objective (0.19–0.99 "
                "away on the toy of BENCHMARKS.md); use centered_clip:τ, exact for every "
                "reply within τ of the others"
            )
        if self.method not in AGGREGATIONS:
            raise ValueError(
                f"aggregation must be one of {list(AGGREGATIONS)}, got {self.method!r}"
            )
        if self.method == "centered_clip":
            radius = self.radius
            ok = isinstance(radius, int | float) and not isinstance(radius, bool)
            if not (ok and math.isfinite(radius) and radius > 0):
                raise ValueError(
                    f"aggregation centered_clip:τ needs a finite radius τ > 0, got {radius!r}"
                )
        elif self.radius is not None:
            raise ValueError(f"aggregation {self.method!r} takes no radius, got {self.radius!r}")

    @classmethod
    def parse(cls, text: str) -> Aggregation:
        """``mean`` or ``centered_clip:τ`` (τ in model-move units, e.g. ``centered_clip:1``)."""
        method, _, radius = text.partition(":")
        if not radius:
            return cls(method)
        try:
            value = float(radius)
        except ValueError:
            raise ValueError(
                f"aggregation must look like centered_clip:0.5, got {text!r}"
            ) from None
        return cls(method, value)

    def check_backend(self, backend: Backend) -> None:
        """Refuse, by name and with the reason, a backend that cannot aggregate robustly."""
        if self.method != "mean" and backend.refuses_robust_aggregation:
            raise ValueError(
                f"aggregation {self.method!r} cannot be used with {backend.name!r}: "
                f"{backend.refuses_robust_aggregation}"
            )

    def apply(self, replies: Sequence[Reply], blocks: Sequence[list[ReplyBlock]]) -> list[Reply]:
        """The replies, each block's move clipped to within τ of the blocks' median move
        (``blocks[k]``: ``Backend.reply_blocks`` of ``replies[k]``)."""
        if self.method == "mean" or len(replies) < 2:
            return list(replies)
        tensors = [dict(reply.tensors) for reply in replies]
        prefixes = dict.fromkeys(block.prefix for held in blocks for block in held)
        for prefix in prefixes:
            holders = [
                (k, block) for k, held in enumerate(blocks) for block in held
                if block.prefix == prefix
            ]  # fmt: skip
            moves = {k: block.move(tensors[k]) for k, block in holders}
            centre = _median(list(moves.values()))
            for k, block in holders:
                deviation = {n: m - centre[n] for n, m in moves[k].items()}
                norm = math.sqrt(sum(float(d.pow(2).sum()) for d in deviation.values()))
                if norm <= self.radius:
                    continue
                clipped = {n: centre[n] + d * (self.radius / norm) for n, d in deviation.items()}
                tensors[k].update(block.tensors_for(clipped, tensors[k]))
        return [
            dataclasses.replace(reply, tensors=held)
            for reply, held in zip(replies, tensors, strict=True)
        ]


def _median(moves: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Coordinate-wise median over the moves that hold each name (the mean of the two middle
    values for an even count, so two replies are clipped symmetrically about their mean)."""
    names = dict.fromkeys(n for move in moves for n in move)
    centre = {}
    for name in names:
        values = torch.stack([move[name] for move in moves if name in move]).sort(dim=0).values
        k = len(values)
        centre[name] = (values[(k - 1) // 2] + values[k // 2]) / 2
    return centre
