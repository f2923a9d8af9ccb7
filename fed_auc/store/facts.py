"""What tells one run from another in a list, read back from the store: the data it ran on,
its transport, its sites and the positive class its AUCs are about (``fed-auc runs``).

A run records its data cards when it starts training; a warm-up run or one that failed before
has none, so the recorded config (``site_data``, ``data_record``) and the sites of its rounds
stand in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fed_auc.data.labels import federation_positive_class
from fed_auc.store.run_store import RunStore


def data_source(config: dict[str, Any] | None) -> str:
    """Where a run's data came from, in a few words: ``synthetic``, ``site files``, or the
    source kind and file name (``medmnist:breastmnist.npz``)."""
    config = config or {}
    if config.get("site_files") or config.get("data") == "site files":
        return "site files"
    data = str(config.get("data", "synthetic"))
    kind, _, path = data.partition(":")
    return f"{kind}:{Path(path.split(':')[0]).name}" if path else kind


def run_facts(store: RunStore, run_id: str, config: dict[str, Any] | None) -> dict[str, Any]:
    """``data``, ``transport``, ``sites`` (names), ``positive_class`` (per label; None where
    the run recorded none) and ``warmup_for`` (the main run of a warm-up run) of ``run_id``."""
    config = config or {}
    recorded_sites = store.sites(run_id)
    cards = [{"site": site, **_json(card)} for site, card in
             zip(recorded_sites["site"], recorded_sites["summary"], strict=True)]  # fmt: skip
    recorded = config.get("site_data") or {}
    sites = [c["site"] for c in cards] or list(recorded)
    if not sites:
        sites = sorted(set(store.site_rounds(run_id)["site"]))
    positive = federation_positive_class(cards) or federation_positive_class(
        [{"site": site, **(data or {})} for site, data in recorded.items()]
    )
    return {
        "data": data_source(config),
        "transport": config.get("transport", "local"),
        "sites": sites,
        "positive_class": positive,
        "warmup_for": config.get("warmup_for"),
    }


def _json(value: Any) -> dict[str, Any]:
    card = json.loads(value) if isinstance(value, str) else value
    return card if isinstance(card, dict) else {}
