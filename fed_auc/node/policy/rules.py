"""A node's policy: what its site operator lets the federation ask, from the site file's
``[policy]`` table, read and checked when the file is read (an error names the file and the key).

```toml
[policy]
experiments = ["chest-*"]          # run ids it takes part in (shell patterns); default: any
coordinators = ["fl.example.org:9092"]  # HOST:PORT fed-auc node may connect to; default: any
backends = ["coda_plus", "fedavg"] # default: any
dp_modes = ["example"]             # none, update, example; default: any
max_epsilon_per_run = 4.0          # a run's target ε may not exceed it (a DP run needs one)
lifetime_epsilon = 8.0             # ε per dataset over every run on the same images
max_delta = 1e-5                   # the δ of every run (and of the lifetime account)
splits = ["val", "test"]           # splits it scores for the coordinator; never "train"
min_split_n = 50                   # a split smaller than this is never reported on
min_split_positives = 5            # nor one with fewer positives (or negatives) per label
pooled_scores = false              # whether per-image scores may leave (pooled AUC)
require_secure_aggregation = true  # refuse an update that would leave unmasked
require_approval = true            # train only experiments its operator approved
approved = ["3f1c..."]             # experiment digests approved ahead of time
```

Without a ``[policy]`` table a node keeps the old behaviour (any experiment, no approval)
except that it never scores its training split; with one, ``require_approval`` defaults to
true.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DP_MODES = ("none", "update", "example")
EVALUATED_SPLITS = ("val", "test")  # "train" is never one: its scores describe the training data
POLICY_FOLDER = "policy"  # under the site's state directory: refusals, approvals, lifetime ε
DIGEST = re.compile(r"[0-9a-f]{64}")
POLICY_KEYS = (
    "experiments", "coordinators", "backends", "dp_modes", "max_epsilon_per_run",
    "lifetime_epsilon", "max_delta", "splits", "min_split_n", "min_split_positives",
    "pooled_scores", "require_secure_aggregation", "require_approval", "approved",
)  # fmt: skip


@dataclass(frozen=True)
class NodePolicy:
    """The site operator's rules; the defaults are a node without a ``[policy]`` table.
    ``source``: the file it came from (named in every refusal); ``state_dir``: where its
    records live (``<state_dir>/policy``), None for a node that keeps none (a test)."""

    experiments: tuple[str, ...] | None = None
    coordinators: tuple[str, ...] | None = None
    backends: tuple[str, ...] | None = None
    dp_modes: tuple[str, ...] | None = None
    max_epsilon_per_run: float | None = None
    lifetime_epsilon: float | None = None
    max_delta: float | None = None
    splits: tuple[str, ...] = EVALUATED_SPLITS
    min_split_n: int = 0
    min_split_positives: int = 0
    pooled_scores: bool = True
    require_secure_aggregation: bool = False
    require_approval: bool = False
    approved: tuple[str, ...] = ()
    source: str = "no [policy] table"
    state_dir: Path | None = None

    @property
    def folder(self) -> Path | None:
        """Where the node records refusals, approvals and its lifetime ε (private files)."""
        return None if self.state_dir is None else self.state_dir / POLICY_FOLDER


def parse_policy(table: Any, path: Path, state_dir: Path | None) -> NodePolicy:
    """The ``[policy]`` table of the site file ``path``; an error names the file and the key."""
    where = f"{path}: [policy]"
    if not isinstance(table, dict):
        raise ValueError(f"{path}: policy must be a table ([policy])")
    unknown = sorted(set(table) - set(POLICY_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; valid: {list(POLICY_KEYS)}")
    values: dict[str, Any] = {"require_approval": True}
    for key in ("experiments", "coordinators", "backends", "dp_modes", "splits", "approved"):
        if key in table:
            values[key] = _names(where, key, table[key])
    for mode in values.get("dp_modes", ()):
        if mode not in DP_MODES:
            raise ValueError(f"{where} dp_modes: {mode!r} is not one of {list(DP_MODES)}")
    for split in values.get("splits", ()):
        if split == "train":
            raise ValueError(
                f"{where} splits: 'train' is never evaluated (its scores describe the "
                "images the model was trained on); use val and/or test"
            )
        if split not in EVALUATED_SPLITS:
            raise ValueError(f"{where} splits: {split!r} is not one of {list(EVALUATED_SPLITS)}")
    for digest in values.get("approved", ()):
        if not DIGEST.fullmatch(digest):
            raise ValueError(
                f"{where} approved: {digest!r} is not an experiment digest (64 hex digits)"
            )
    for key in ("max_epsilon_per_run", "lifetime_epsilon", "max_delta"):
        if key in table:
            value = table[key]
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (math.isfinite(value) and value > 0)
            ):
                raise ValueError(f"{where} {key} = {value!r}: must be a number > 0")
            values[key] = float(value)
    if values.get("max_delta", 0.0) >= 1:
        raise ValueError(f"{where} max_delta = {values['max_delta']}: must be < 1")
    for key in ("min_split_n", "min_split_positives"):
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{where} {key} = {value!r}: must be an integer ≥ 0")
            values[key] = value
    for key in ("pooled_scores", "require_secure_aggregation", "require_approval"):
        if key in table:
            if not isinstance(table[key], bool):
                raise ValueError(f"{where} {key} = {table[key]!r}: must be true or false")
            values[key] = table[key]
    return NodePolicy(**values, source=str(path), state_dir=state_dir)


def _names(where: str, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{where} {key} = {value!r}: must be a list of non-empty strings")
    return tuple(value)
