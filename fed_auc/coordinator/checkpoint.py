"""The coordinator's checkpoint: server state and accepted replies per recorded round, written
atomically, the previous one kept.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fed_auc.coordinator.errors import FederationError
from fed_auc.io import CorruptState, load_state, save_state

CHECKPOINT_FILE = "checkpoint.pt"
PREVIOUS_CHECKPOINT_FILE = "checkpoint.prev.pt"


def write_checkpoint(snapshot: Mapping[str, Any], run_dir: Path) -> None:
    """Keep the previous checkpoint, then write this one atomically."""
    path = run_dir / CHECKPOINT_FILE
    if path.exists():
        os.replace(path, run_dir / PREVIOUS_CHECKPOINT_FILE)
    save_state(dict(snapshot), path)


def load_checkpoint(run_dir: Path, round_: int) -> dict[str, Any]:
    """The checkpoint of ``round_`` (the current or the previous file), or a clear error."""
    found = []
    for name in (CHECKPOINT_FILE, PREVIOUS_CHECKPOINT_FILE):
        path = run_dir / name
        if not path.exists():
            continue
        try:
            snapshot = load_state(path)
        except CorruptState as exc:
            found.append(str(exc))
            continue
        if snapshot["round"] == round_:
            return snapshot
        found.append(f"{path} holds round {snapshot['round']}")
    raise FederationError(
        f"cannot resume: the store's last round is {round_} but no checkpoint of it was found "
        f"in {run_dir} ({'; '.join(found) or 'no checkpoint files'})"
    )
