"""benchmarks/systems/scale.py at toy size: a federation beyond 16 sites keeps node state on
disk."""

from __future__ import annotations

import pytest

from benchmarks.systems import scale


def test_linear_fit_recovers_a_line():
    a, b, r2 = scale.linear_fit([4, 8, 16, 32], [1 + 0.5 * k for k in (4, 8, 16, 32)])
    assert (a, b, r2) == pytest.approx((1.0, 0.5, 1.0))


@pytest.mark.slow
def test_toy_federation_of_20_sites_in_a_fresh_process():
    result = scale.measure_in_fresh_process(
        model="tiny", sites=20, selected=3, rounds=1, local_steps=1, data_scale=0.02,
        batch_size=2,
    )
    assert result["round_s_min"] <= result["round_s"] <= result["round_s_max"]
    assert result["peak_mb"] > 50  # a Python process with torch loaded
    # 3 sites trained in each of 2 rounds: their CODASCA state, ~one tiny model each, on disk
    assert 0.05 < result["state_disk_mb"] < 5
    assert result["data_mb"] > 0
