"""benchmarks/claims/dp_epsilon.py at toy size: each row's run, the ε it spent, the table."""

from __future__ import annotations

import math

import pytest

from benchmarks.claims import dp_epsilon

TOY = {"sites": 2, "local_steps": 2, "image_size": 16, "data_scale": 0.2}


@pytest.mark.slow
def test_toy_runs_spend_at_most_their_epsilon_and_fill_the_table():
    results = {
        label: [dp_epsilon.run(norm, epsilon, seed, rounds=1, **TOY) for seed in (0, 1)]
        for label, norm, epsilon in dp_epsilon.rows()
        if norm == "group" and epsilon in (math.inf, 3.0)
    }
    assert list(results) == ["GroupNorm, no DP (ε = ∞)", "GroupNorm, ε = 3"]
    for label, runs in results.items():
        for r in runs:
            assert 0.0 <= r["worst"] <= 1.0 and 0.0 <= r["pooled"] <= 1.0
            if label.endswith("ε = 3"):
                assert 2.9 < r["epsilon"] <= 3.0  # the run spends its whole budget
            else:
                assert math.isinf(r["epsilon"])
    assert results["GroupNorm, ε = 3"] != results["GroupNorm, no DP (ε = ∞)"]
    text = dp_epsilon.table(results)
    assert text.count("\n") == 3  # header, rule, two rows
    dp_row = next(line for line in text.splitlines() if line.startswith("| GroupNorm, ε = 3"))
    reference = results["GroupNorm, no DP (ε = ∞)"]
    private = results["GroupNorm, ε = 3"]
    diffs = [r["pooled"] - g["pooled"] for r, g in zip(private, reference, strict=True)]
    assert dp_epsilon.mean_sd(diffs) in dp_row
