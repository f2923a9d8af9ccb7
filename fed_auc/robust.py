"""Robust aggregation: coordinate-wise median or trimmed mean instead of the weighted mean.

A backend averages every tensor of the valid replies with its weights. To make that average
robust without touching any backend, the coordinator first replaces each tensor of every
reply by the coordinate-wise median (or β-trimmed mean) over the replies that carry it: the
backend's weighted mean of identical values is that value. Robust statistics are unweighted,
as in Yin et al. (ICML 2018, "Byzantine-robust distributed learning"). Counts, steps and
metrics are left alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from fed_auc.algorithms.base import Backend, Reply

AGGREGATIONS = ("mean", "median", "trimmed_mean")


@dataclasses.dataclass(frozen=True)
class Aggregation:
    """``mean`` (the backend's own), ``median``, or ``trimmed_mean`` cutting β at each end."""

    method: str = "mean"
    trim: float = 0.1

    def __post_init__(self) -> None:
        if self.method not in AGGREGATIONS:
            raise ValueError(
                f"aggregation must be one of {list(AGGREGATIONS)}, got {self.method!r}"
            )
        if not (isinstance(self.trim, int | float) and 0 <= self.trim < 0.5):
            raise ValueError(f"aggregation trimmed_mean:β needs β in [0, 0.5), got {self.trim!r}")

    @classmethod
    def parse(cls, text: str) -> Aggregation:
        """``mean``, ``median``, ``trimmed_mean`` or ``trimmed_mean:0.2``."""
        method, _, trim = text.partition(":")
        if trim and method != "trimmed_mean":
            raise ValueError(f"aggregation {method!r} takes no parameter, got {text!r}")
        if not trim:
            return cls(method)
        try:
            beta = float(trim)
        except ValueError:
            raise ValueError(f"aggregation must look like trimmed_mean:0.2, got {text!r}") from None
        return cls(method, beta)

    def check_backend(self, backend: Backend) -> None:
        """Refuse, by name and with the reason, a backend that cannot aggregate robustly."""
        if self.method != "mean" and backend.refuses_robust_aggregation:
            raise ValueError(
                f"aggregation {self.method!r} cannot be used with {backend.name!r}: "
                f"{backend.refuses_robust_aggregation}"
            )

    def apply(self, replies: Sequence[Reply]) -> list[Reply]:
        """The replies with every tensor replaced by the robust statistic over its holders."""
        if self.method == "mean" or len(replies) < 3:
            return list(replies)
        names = dict.fromkeys(name for reply in replies for name in reply.tensors)
        robust = {}
        for name in names:
            held = [r.tensors[name] for r in replies if name in r.tensors]
            robust[name] = None  # fewer than 3 values, or counts: the backend's mean
            if len(held) >= 3 and held[0].is_floating_point():
                robust[name] = self.statistic(torch.stack(held))
        return [
            dataclasses.replace(
                reply,
                tensors={
                    n: t if robust[n] is None else robust[n] for n, t in reply.tensors.items()
                },
            )
            for reply in replies
        ]

    def statistic(self, stacked: torch.Tensor) -> torch.Tensor:
        """Median (the mean of the two middle values for an even count) or trimmed mean."""
        values = stacked.sort(dim=0).values
        k = len(values)
        if self.method == "median":
            return (values[(k - 1) // 2] + values[k // 2]) / 2
        cut = int(self.trim * k)
        return values[cut : k - cut].mean(dim=0)
