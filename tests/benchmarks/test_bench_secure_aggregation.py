"""benchmarks/systems/secure_aggregation.py at toy size: what it reports is what it measured."""

from __future__ import annotations

import statistics

from benchmarks.systems import secure_aggregation as bench
from fed_auc.experiment.config import ExperimentConfig


def test_toy_rounds_report_times_ratios_and_bytes(tmp_path):
    config = ExperimentConfig(
        model="tiny", image_size=16, sites=3, local_steps=1, batch_size=8, data_scale=0.2,
        rounds=3, runs_dir=str(tmp_path),
    )  # fmt: skip
    result = bench.measure(config, rounds=2)
    assert len(result["ratios"]) == 2 and result["ratio"] == statistics.median(result["ratios"])
    plain, secure = result["plain_bytes"], result["secure_bytes"]
    assert plain["protocol"] == 0 < secure["protocol"]
    # a float32 value travels as one uint64 word: twice the bytes, plus weights and protocol
    assert secure["up"] > 2 * plain["up"]
    assert secure["down"] > plain["down"]  # the same broadcast, plus keys and shares
    row = bench.table_row(config, 2, result)
    assert row.startswith("| codasca | tiny @ 16 px | 2 rounds, 3 × 1 steps, batch 8 |")
    assert f"**{result['ratio']:.2f}**" in row
