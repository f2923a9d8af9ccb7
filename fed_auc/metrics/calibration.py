"""Calibrated probabilities from a model's scores: the card's isotonic map, applied."""

from __future__ import annotations

from typing import Any

import numpy as np


def apply_calibration(scores: np.ndarray, entry: dict[str, Any]) -> np.ndarray:
    """The calibrated probability of each score: the card's isotonic map (its knots
    ``entry["x"]`` → ``entry["y"]``, linear between them, flat beyond the ends), clipped to
    [0, 1]. A score is a ranking, not a probability; this map, fitted on held-out labels, is
    what turns it into one."""
    return np.clip(np.interp(scores, entry["x"], entry["y"]), 0, 1)
