"""What a round writes to the store: the round's row and each site's, as dataclasses the
coordinator fills and ``RunStore.record_round`` writes in one transaction."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def as_float(value: Any) -> float | None:
    """A store value as a float; SQL NULL and NaN (pandas' missing value) as None."""
    return None if value is None or value != value else float(value)


def as_int(value: Any) -> int | None:
    """A store value as an int; SQL NULL and NaN as None."""
    return None if value is None or value != value else int(value)


@dataclass
class SiteRound:
    """One site's row for one round."""

    site: str
    status: str
    steps: int | None = None
    trained_groups: list[str] | None = None
    n: int | None = None
    positives: list[int] | None = None
    auc: float | None = None
    auc_lo: float | None = None
    auc_hi: float | None = None
    val_auc: float | None = None
    n_test: int | None = None
    test_positives: list[int] | None = None
    personal_auc: float | None = None
    personal_auc_lo: float | None = None
    personal_auc_hi: float | None = None
    update_norm: float | None = None
    drift: float | None = None
    cosine: float | None = None
    cv_drift: float | None = None
    train_loss: float | None = None
    duration_s: float | None = None
    bytes_down: int | None = None
    bytes_up: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    dp_epsilon: float | None = None  # DP-SGD: ε this site has spent up to this round
    dp_delta: float | None = None
    dp_relation: str | None = None  # what ε protects: accounting.RELATIONS[mode]


@dataclass
class RoundRecord:
    """A whole round: the global row, every site's row and the round's events."""

    round: int
    stage: int | None = None
    lr: float | None = None
    global_auc: float | None = None
    global_val_auc: float | None = None
    worst_site_auc: float | None = None
    mean_site_auc: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    duration_s: float | None = None
    bytes_down: int = 0
    bytes_up: int = 0
    sites: list[SiteRound] = field(default_factory=list)
    events: list[tuple[str | None, str, str]] = field(default_factory=list)  # site, level, msg


_JSON_COLUMNS = {"trained_groups", "positives", "test_positives", "metrics"}


def encode_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row for SQLite: its list and dict columns as JSON text."""
    return {k: json.dumps(v) if k in _JSON_COLUMNS and v is not None else v for k, v in row.items()}
