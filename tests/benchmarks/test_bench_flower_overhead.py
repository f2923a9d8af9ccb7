"""benchmarks/systems/flower_overhead.py at toy size: its numbers add up (Flower runs are
e2e-tested)."""

from __future__ import annotations

import pytest

TOY = {"algorithm": "codasca", "sites": 3, "rounds": 2, "local_steps": 2, "model": "tiny",
       "image_size": 16, "data_scale": 0.15, "seed": 3, "batch_size": 8}  # fmt: skip


@pytest.fixture(scope="module")
def bench():
    from benchmarks.systems import flower_overhead

    return flower_overhead


def test_slowest_site_compute_is_its_training_plus_the_next_evaluation(bench):
    events = [
        {"site": "a", "kind": "evaluate", "s": 0.5},  # round 0: the initial model
        {"site": "b", "kind": "evaluate", "s": 0.25},
        {"site": "a", "kind": "train", "round": 0, "s": 2.0},
        {"site": "b", "kind": "train", "round": 0, "s": 3.0},
        {"site": "a", "kind": "evaluate", "s": 0.5},
        {"site": "b", "kind": "evaluate", "s": 1.0},
        {"site": "a", "kind": "train", "round": 1, "s": 4.0},
        {"site": "b", "kind": "train", "round": 1, "s": 1.0},
        {"site": "a", "kind": "evaluate", "s": 0.5},
        {"site": "b", "kind": "evaluate", "s": 0.5},
    ]
    assert bench.compute_per_round(events) == {1: 4.0, 2: 4.5}
    for e, size in zip(events, [10, 10, 100, 100, 20, 20, 50, 50, 30, 30], strict=True):
        e["wire"] = size
    assert bench.wire_per_round(events) == {1: 240, 2: 160}


def test_in_process_rounds_and_summary_are_consistent(bench, tmp_path):
    results = bench.measure(TOY, ["in-process"], tmp_path)
    rows = results["in-process"]["rounds"]
    assert [r["round"] for r in rows] == [1, 2]
    for r in rows:
        assert 0 < r["compute"] < r["s"]
        assert r["overhead"] == pytest.approx(r["s"] - r["compute"])
        assert r["bytes"] > 0
    mean = bench.summarize(results)["in-process"]
    assert mean["s"] == pytest.approx((rows[0]["s"] + rows[1]["s"]) / 2)
    assert mean["overhead"] == pytest.approx(mean["s"] - mean["compute"])
    assert mean["x_in_process"] == pytest.approx(1.0)
    assert mean["naive_over_this"] is None  # the naive transport did not run
    assert len(results["in-process"]["load"]) == 2


def test_ratios_and_failures_in_the_table(bench):
    def run(s, compute):
        return {"rounds": [{"round": 1, "s": s, "compute": compute, "overhead": s - compute,
                            "bytes": 2_000_000}], "load": [1.0, 2.0]}  # fmt: skip

    results = {"in-process": run(4.0, 3.0), "flower": run(8.0, 2.0), "naive": run(32.0, 2.0)}
    results["flower"]["rounds"][0]["wire"] = 500_000
    means = bench.summarize(results)
    assert means["flower"]["x_in_process"] == pytest.approx(2.0)
    assert means["flower"]["naive_over_this"] == pytest.approx(30.0 / 6.0)
    results["broken"] = {"failed": "coordinator exited with status 1", "load": [0.5, 0.7],
                         "wall_s": 612.4}  # fmt: skip
    text = bench.table(results)
    assert "| flower | 8.0 | 2.0 | 6.0 | 2.00 | 5.0 | 2.0 | 0.5 | 1.0 → 2.0 |" in text
    assert "| naive | 32.0 | 2.0 | 30.0 | 8.00 | 1.0 | 2.0 | — | 1.0 → 2.0 |" in text
    assert "| broken | failed: coordinator exited with status 1 after 612 s |" in text
