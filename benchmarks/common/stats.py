"""Summary statistics the benchmark tables print: mean ± sd over seeds and the paired
difference of two contenders with its 95 % t-interval (Student's t quantile from SciPy)."""

from __future__ import annotations

import math
import statistics

from scipy.stats import t


def paired_ci(diffs: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean paired difference and its two-sided t-interval at ``level`` (NaN bounds with one
    pair; a zero-width interval when every difference is the same)."""
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return mean, math.nan, math.nan
    quantile = float(t.ppf(0.5 + level / 2, df=len(diffs) - 1))
    half = quantile * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return mean, mean - half, mean + half
