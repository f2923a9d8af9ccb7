"""How many local steps each site does in a round: its τ_i.

Real sites differ: a small hospital's node finishes 3 steps while a large one does 20. τ_i is
either the backend's I for every site, fixed per site, or drawn per round and site from a
seeded range [low, high], so a rerun with the same seed does the same work.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LocalWork:
    fixed: Mapping[str, int] = field(default_factory=dict)
    low: int | None = None
    high: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for site, steps in self.fixed.items():
            if not isinstance(steps, int) or steps < 1:
                raise ValueError(
                    f"local steps of site {site!r} must be an integer ≥ 1, got {steps!r}"
                )
        if (self.low is None) != (self.high is None):
            raise ValueError("a local-steps range needs both its low and its high end")
        if self.low is not None and not 1 <= self.low <= self.high:
            raise ValueError(
                f"local_steps_range must satisfy 1 ≤ MIN ≤ MAX, got {self.low}:{self.high}"
            )

    @classmethod
    def from_range(cls, text: str, seed: int = 0) -> LocalWork:
        """Parse ``MIN:MAX`` (e.g. ``3:20``)."""
        try:
            low, high = (int(part) for part in text.split(":"))
        except ValueError:
            raise ValueError(
                f"local_steps_range must look like MIN:MAX (e.g. 3:20), got {text!r}"
            ) from None
        return cls(low=low, high=high, seed=seed)

    def steps(self, site: str, round_: int, default: int) -> int:
        """τ_i of ``site`` in ``round_``: fixed, drawn (seeded by site, round), or ``default``."""
        if site in self.fixed:
            return self.fixed[site]
        if self.low is not None:
            return random.Random(f"{self.seed}:{site}:{round_}").randint(self.low, self.high)
        return default
