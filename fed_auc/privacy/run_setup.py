"""A run's setup, fixed on the node at its first release.

A release is keyed by what the coordinator sends with it (``accounting.release_key``), but a
node also computes from what it was told once: the experiment's ``NodeSetup`` (image size, the
model and its input normalization, a synthetic site's seed, data scale, label count, DP) and
the site's data. If the same run, asked the same round again, could change one of them, it
would get a different computation under the same key: the same noise, two noisy replies
whose difference is noise-free. So the first release of a run writes what it was computed
from (``run_setup.json`` in the run's state directory, atomic, readable by the node's user
only), and a later request for that run with anything else is refused by name, never
re-keyed. A new setup is a new run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fed_auc.io import save_json
from fed_auc.privacy.accounting import SetupChanged

RUN_SETUP_FILE = "run_setup.json"


def fix_run_setup(state_dir: str | Path, record: Mapping[str, Any]) -> None:
    """Write ``record`` (the setup's fields and the data's digest) at the run's first release;
    afterwards refuse (``SetupChanged``, naming the fields that differ) any other."""
    path = Path(state_dir) / RUN_SETUP_FILE
    current = json.loads(json.dumps(record, sort_keys=True))  # as it reads back from disk
    if not path.exists():
        save_json(current, path)
        return
    fixed = json.loads(path.read_text())
    changed = differing_fields(fixed, current)
    if changed:
        raise SetupChanged(
            f"this run's setup was fixed at its first release ({path}); this request "
            f"changes {', '.join(changed)}: refused (a changed setup is a new run)"
        )


def differing_fields(
    fixed: Mapping[str, Any], current: Mapping[str, Any], prefix: str = ""
) -> list[str]:
    """The dotted names of the fields whose values differ (mappings compared field by field)."""
    out = []
    for name in sorted(set(fixed) | set(current)):
        old, new = fixed.get(name), current.get(name)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            out += differing_fields(old, new, f"{prefix}{name}.")
        elif old != new or (name in fixed) != (name in current):
            out.append(f"{prefix}{name}")
    return out
