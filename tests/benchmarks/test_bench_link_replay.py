"""benchmarks/systems/link_replay.py: the replay's arithmetic against properties (an infinite
link leaves the compute, a link's time grows with the bytes over its rate, the slowest site
sets the round), and a toy arm read back from a real run's store."""

from __future__ import annotations

import pytest

from benchmarks.systems.link_replay import (
    RoundCost,
    SiteCost,
    replay,
    round_seconds,
    table,
    to_target,
    train_arm,
)

MB = 10**6


def _round(number: int, auc: float, *sites: tuple[int, int, float]) -> RoundCost:
    return RoundCost(number, tuple(SiteCost(*s) for s in sites), auc)


def test_the_slowest_site_over_its_link_sets_the_round():
    cost = _round(1, 0.6, (10 * MB, 5 * MB, 2.0), (1 * MB, 1 * MB, 3.0))
    assert round_seconds(cost, 1e12, 1e12) == pytest.approx(3.0)  # only compute is left
    # 10 MB at 80 Mbit/s down = 1 s, 5 MB at 40 Mbit/s up = 1 s, plus 2 s of training
    assert round_seconds(cost, 80, 40) == pytest.approx(4.0)
    slow = round_seconds(cost, 8, 4)  # a tenth of the rate: ten times the transfer
    assert slow == pytest.approx(10 + 2 + 10)


def test_time_to_target_is_the_first_round_that_reaches_it():
    costs = [_round(r, auc, (MB, MB, 1.0)) for r, auc in ((1, 0.55), (2, 0.71), (3, 0.69))]
    times = replay(costs, 16, 16)  # 0.5 + 1 + 0.5 s per round
    assert times == pytest.approx([2.0, 4.0, 6.0])
    assert to_target(costs, times, 0.70) == (2, pytest.approx(4.0))
    assert to_target(costs, times, 0.80) is None


def test_a_toy_arm_is_read_back_from_its_store_and_tabled():
    options = {"model": "tiny", "image_size": 16, "sites": 2, "partition": "imratio:0.1,0.1",
               "data_scale": 0.2, "batch_size": 8}  # fmt: skip
    arm = train_arm("codasca", 2, 4, 0, options)
    costs = arm["costs"]
    assert [c.round for c in costs] == [1, 2]
    assert all(len(c.sites) == 2 for c in costs)
    assert all(
        s.bytes_down > 0 and s.bytes_up > 0 and s.train_s > 0 for c in costs for s in c.sites
    )
    text, target = table([arm], target=0.0)
    assert target == 0.0 and "| codasca | 2 | none | 2 |" in text and "1, " in text
    int8 = train_arm("codasca", 2, 4, 0, options, compress="int8")  # a compressed arm
    for plain, small in zip(costs, int8["costs"], strict=True):
        for a, b in zip(plain.sites, small.sites, strict=True):
            assert a.bytes_up / b.bytes_up > 3 and a.bytes_down / b.bytes_down > 3
    assert "| codasca | 2 | int8 | 2 |" in table([arm, int8], target=0.0)[0]
