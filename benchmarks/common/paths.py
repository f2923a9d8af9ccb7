"""Where the benchmarks find the repository and the data files kept beside it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: benchmarks/common/paths.py
RESULTS = ROOT / "benchmarks" / "results"
BREASTMNIST = ROOT.parent / "shared" / "data" / "breastmnist.npz"  # outside the repository
