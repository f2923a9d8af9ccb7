"""benchmarks/systems/overhead.py at toy size: the reported ratio is the median of per-round
ratios."""

from __future__ import annotations

import statistics

from benchmarks.systems import overhead
from fed_auc.experiment.config import ExperimentConfig

TOY = {"local_steps": 2, "batch_size": 8, "data_scale": 0.2}


def test_toy_measure_ratio_is_its_parts(tmp_path):
    config = ExperimentConfig(model="tiny", image_size=16, sites=2, runs_dir=str(tmp_path), **TOY)
    result = overhead.measure(config, rounds=3)
    ratios = result["ratios"]
    assert len(ratios) == 3 and all(r > 0 for r in ratios)
    assert result["ratio"] == statistics.median(ratios)
    assert (result["ratio_min"], result["ratio_max"]) == (min(ratios), max(ratios))
    row = overhead.table_row(config, 3, result)
    assert "| codasca | tiny @ 16 px | 3 rounds, 2 × 2 steps, batch 8 |" in row
    assert f"| {result['fed_ms']:.1f} | {result['plain_ms']:.1f} |" in row
    assert f"**{result['ratio']:.3f}** ({min(ratios):.3f}–{max(ratios):.3f})" in row


def test_quick_rows_use_quick_rounds_and_image_size(tmp_path):
    rows = (
        overhead.Row("local_sgda", "tiny", 28, sites=2, rounds=9, quick_rounds=1),
        overhead.Row("codasca", "tiny", 28, sites=2, rounds=9, quick_rounds=1, quick_image_size=16),
    )
    text = overhead.run(rows, quick=True, runs_dir=str(tmp_path), **TOY)
    lines = text.splitlines()
    assert lines[:2] == overhead.HEADER.splitlines() and len(lines) == 4
    assert lines[2].startswith("| local_sgda | tiny @ 28 px | 1 rounds, 2 × 2 steps")
    assert lines[3].startswith("| codasca | tiny @ 16 px | 1 rounds, 2 × 2 steps")
