"""How the commands print numbers: three decimals, ``n/a`` where there is none."""

from __future__ import annotations


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
