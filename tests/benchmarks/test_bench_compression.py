"""benchmarks/systems/compression.py: a real arm reads its bytes back from the store, and the
table pairs every compressed arm with the uncompressed one of the same seed."""

from __future__ import annotations

import pytest

from benchmarks.systems.compression import table, train

SMALL = {"model": "tiny", "image_size": 16, "sites": 2, "rounds": 2, "local_steps": 2,
         "batch_size": 8, "data_scale": 0.2, "secure_aggregation": False}  # fmt: skip


def test_an_int8_arm_records_a_quarter_of_the_bytes():
    plain, int8 = (train("synthetic", mode, 0, SMALL) for mode in ("none", "int8"))
    assert 0 <= int8["auc"] <= 1 and int8["mode"] == "int8"
    assert plain["bytes"] / int8["bytes"] == pytest.approx(3.75, abs=0.25)


def test_the_table_pairs_each_arm_with_the_uncompressed_one_of_its_seed():
    results = [
        {"data": "synthetic", "mode": mode, "seed": seed, "auc": auc, "bytes": size}
        for mode, size, aucs in (
            ("none", 400, (0.60, 0.70)),
            ("fp16", 200, (0.61, 0.71)),  # +0.01 on both seeds: a zero-width interval
            ("int8", 100, (0.58, 0.72)),
        )
        for seed, auc in enumerate(aucs)
    ]
    text = table(results)
    assert (
        "| synthetic | fp16 | 0.000 | 2.00× | 0.6600 ± 0.0707 | +0.0100 [+0.0100, +0.0100] |"
        in text
    )
    assert "| synthetic | int8 | 0.000 | 4.00× |" in text and "| synthetic | none |" in text
