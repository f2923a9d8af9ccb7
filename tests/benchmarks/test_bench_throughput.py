"""benchmarks/systems/throughput.py at toy size: rates, ratios and tables agree with each other."""

from __future__ import annotations

import pytest

from benchmarks.systems import throughput as bench


def test_node_and_plain_rates_give_the_ratio() -> None:
    result = bench.node_vs_plain("tiny", 28, batch=8, steps=2, rounds=3)
    assert len(result["node"]) == len(result["plain"]) == len(result["time_ratio"]) == 3
    rows = zip(result["node"], result["plain"], result["time_ratio"], strict=True)
    for node, plain, ratio in rows:
        assert node > 0 and plain > 0
        assert ratio == pytest.approx(plain / node)


@pytest.mark.slow
def test_a_variant_runs_in_its_own_process_and_tabulates() -> None:
    s = bench.Settings(
        model="tiny", sizes=((28, 8),), variant_size=(28, 8), local_steps=1, rounds=1,
        repeats=1, variants=("1 thread, channels-last",),
    )  # fmt: skip
    (variant,) = bench.variant_table(s)
    assert variant["name"] == "1 thread, channels-last"
    assert len(variant["img_s"]) == 1 and variant["img_s"][0] > 0 and variant["warmup_s"] > 0
    variants = [variant]
    sizes = [bench.node_vs_plain("tiny", 28, 8, 1, 1)]
    cli = [{"threads": "auto", "wall_s": [1.0, 3.0, 2.5]}]
    text = bench.markdown(
        sizes, variants, s, "python -m benchmarks.systems.throughput", [0.5, 1.5], cli
    )
    assert "| auto | 2.5 (1.0–3.0) |" in text
    assert "| 28 px | 8 |" in text and "| 1 thread, channels-last | " in text
    assert "Load average (1 min) during the run: 0.50–1.50" in text
