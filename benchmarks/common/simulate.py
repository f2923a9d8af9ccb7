"""One ``fed-auc simulate --json`` run in a subprocess, as the claim benchmarks run them."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any


def simulate(command: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``command`` (a ``fed-auc simulate ... --json`` command line) on one OpenMP thread;
    its JSON summary and the card of the model it exported. A failed run raises with the end
    of its stderr."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(command, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed:\n{out.stderr[-2000:]}")
    summary = json.loads(out.stdout)
    card = json.loads((Path(summary["model_path"]).parent / "model_card.json").read_text())
    return summary, card
