"""The repository root, for tests that read its files (README, hospitals/, app/, scripts)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # tests/support/paths.py
