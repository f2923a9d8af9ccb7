"""A site's lifetime ε: every run on the same images spends from one budget.

The node keeps, per dataset (``fed_auc.data.digest.site_data_digest``: the same images under
another run id or site name are the same dataset), the runs that released something computed
from it, in ``<state_dir>/policy/lifetime.json`` (0600). What a run spent is read from that
run's own ledger (``fed_auc.privacy.accounting.recorded_steps``),
and the runs are composed by ``dp-accounting`` (RDP), never summed by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

from fed_auc.node.policy.records import read_json, write_private
from fed_auc.privacy.accounting import epsilon, recorded_steps

LIFETIME_FILE = "lifetime.json"


class LifetimeLedger:
    """The runs per dataset digest (each local state folder of a run: a run's hold-out
    evaluation nodes keep another one), and the ε they spent together."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / LIFETIME_FILE
        self.datasets: dict[str, dict[str, str]] = read_json(self.path, {})  # digest → dir → run

    def join(self, digest: str, run_id: str, run_dir: Path) -> None:
        """Count ``run_id`` (its ledger in ``run_dir``) against the dataset ``digest``."""
        runs = self.datasets.setdefault(digest, {})
        if runs.get(str(run_dir)) != run_id:
            runs[str(run_dir)] = run_id
            write_private(self.path, json.dumps(self.datasets, indent=2))

    def spent(self, digest: str, delta: float, besides: str | None = None) -> float:
        """ε of every run on ``digest`` but ``besides``, composed at ``delta``."""
        steps = [
            step
            for run_dir, run_id in self.datasets.get(digest, {}).items()
            if run_id != besides
            for step in recorded_steps(run_dir)
        ]
        return epsilon(steps, delta) if steps else 0.0

    def runs(self, digest: str, besides: str | None = None) -> list[str]:
        return sorted({run for run in self.datasets.get(digest, {}).values() if run != besides})
