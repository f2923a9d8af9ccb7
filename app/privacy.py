"""What the Sites page says about differential privacy, from the store alone. No Streamlit.

The run's config says which DP it used; ``site_rounds.dp_epsilon`` holds each site's ε spent
so far (its own accountant, as the node reported it: per example under DP-SGD, per site under
update-level DP), carried into the rounds it did not train; ``status == "budget_spent"``
marks a site that refused to release a further update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from app.queries import RunData

BUDGET_SPENT = "budget_spent"
DEFAULT_DELTA = 1e-5  # ExperimentConfig's, for a config that did not record one
EXAMPLE_SCOPE = (
    "ε is each site's own: it bounds what everything that site sent over the run (every update, "
    "hence also the final model) reveals about any one of its training examples (one image "
    "row), except with probability δ. A patient with k images is covered at about k·ε. It "
    "does not cover the site's counts, prevalence, steps or evaluation results, which are not "
    "noised."
)
UPDATE_SCOPE = (
    "ε is each site's own, at the site level: it bounds what everything that site sent over the "
    "run (each update clipped to C with Gaussian noise σ·C, hence also the final model) reveals "
    "about the site's whole dataset, all its patients together, against any other dataset in its "
    "place, except with probability δ. It says nothing finer about one patient than about the "
    "whole hospital, and with few sites the noise a small ε needs is large against the sites' "
    "mean update. Every round a site took part in counts in full (the site sample is seeded, not "
    "secret). It does not cover the site's counts, prevalence, steps or evaluation results."
)
# The relation of runs recorded before the store named it (their update-level ε was computed
# for add/remove of a site, not replace-one).
LEGACY_RELATIONS = {
    "example": "add or remove one training example (image) of a site",
    "update": "add or remove one hospital's whole training data (recorded before replace-one)",
}
CLIP_ONLY_SCOPE = (
    "Update-level clipping without noise (σ = 0) bounds each site's influence on a round but "
    "is no differential privacy: no ε."
)


@dataclass(frozen=True)
class DPSettings:
    """A run's DP options as its config recorded them."""

    mode: str  # "example" or "update"
    clip: float | None
    noise_multiplier: float | None
    delta: float
    target_epsilon: float | None

    @property
    def accounted(self) -> bool:
        """Whether the sites ran an accountant (DP-SGD, or update-level DP with noise)."""
        noised = bool(self.noise_multiplier) or self.target_epsilon is not None
        return self.mode == "example" or noised

    def noise_text(self) -> str:
        if self.target_epsilon is not None:
            per = "per site" if self.mode == "example" else "for the planned rounds"
            return f"σ calibrated {per} to spend ε = {self.target_epsilon:g} over the run"
        return f"σ = {self.noise_multiplier:g}" if self.noise_multiplier else "none"

    def of_target(self) -> str:
        """' of target T' when the run set a target ε, else nothing."""
        return "" if self.target_epsilon is None else f" of target {self.target_epsilon:g}"


def dp_settings(config: dict[str, Any] | None) -> DPSettings | None:
    """The run's DP, or None for a run without differential privacy."""
    config = config or {}
    mode, clip = config.get("dp"), config.get("dp_clip")
    if mode is None and clip is None:
        return None
    mode = mode or "update"  # dp_clip alone is update-level DP
    noise = config.get("dp_noise")
    return DPSettings(
        mode=mode,
        clip=clip,
        noise_multiplier=None if mode == "example" and not noise else noise,
        delta=config.get("dp_delta", DEFAULT_DELTA),
        target_epsilon=config.get("target_epsilon"),
    )


def relation(data: RunData, mode: str) -> str:
    """The neighbouring relation the run's ε are for, as the store recorded it beside them."""
    rows = data.site_rounds
    if "dp_relation" in rows:
        named = rows["dp_relation"].dropna()
        if len(named):
            return str(named.iloc[-1])
    return LEGACY_RELATIONS[mode]


def epsilon_by_round(data: RunData) -> pd.DataFrame:
    """ε spent so far per round (rows) and site (columns), where the store recorded one."""
    rows = data.site_rounds.dropna(subset=["dp_epsilon"])
    return rows.pivot_table(index="round", columns="site", values="dp_epsilon", aggfunc="max")


def epsilon_table(data: RunData, exported_round: int | None) -> pd.DataFrame:
    """Per site: ε spent (latest), at the exported model's round, δ, and whether and when
    its budget was spent (the first round it refused to send an update)."""
    rows = data.site_rounds
    spent_rows = rows.dropna(subset=["dp_epsilon"]).sort_values("round")
    refused = rows[rows["status"] == BUDGET_SPENT].groupby("site")["round"].min()
    out = []
    for site in sorted(set(spent_rows["site"]) | set(refused.index)):
        mine = spent_rows[spent_rows["site"] == site]
        entry: dict[str, Any] = {
            "site": site,
            "ε spent": float(mine["dp_epsilon"].iloc[-1]) if len(mine) else 0.0,
            "as of round": int(mine["round"].iloc[-1]) if len(mine) else None,
            "δ": float(mine["dp_delta"].iloc[-1]) if len(mine) else None,
            "σ": _latest_sigma(mine),
            "budget": (
                f"spent: stopped at round {int(refused[site])}" if site in refused.index else "open"
            ),
        }
        if exported_round is not None:
            upto = mine[mine["round"] <= exported_round]
            entry["ε at the exported round"] = float(upto["dp_epsilon"].max()) if len(upto) else 0.0
        out.append(entry)
    return pd.DataFrame(out)


def _latest_sigma(rows: pd.DataFrame) -> float | None:
    """The noise multiplier the site last reported (calibrated per site for a target ε)."""
    for metrics in reversed(rows["metrics"].tolist()):
        if isinstance(metrics, dict) and metrics.get("dp_noise_multiplier") is not None:
            return float(metrics["dp_noise_multiplier"])
    return None
