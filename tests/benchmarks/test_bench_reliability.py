"""benchmarks/reliability at toy size: nothing hostile averaged in; the report adds up."""

from __future__ import annotations

import pytest

from benchmarks.reliability.bad_inputs import bad_inputs
from benchmarks.reliability.faults import HOSTILE, flaky_nodes, hostile_replies
from benchmarks.reliability.report import render

TOY = {"sites": 3, "rounds": 1, "local_steps": 1, "seed": 11, "data_scale": 0.2, "batch_size": 16}


@pytest.mark.slow
def test_toy_faults_and_report(tmp_path):
    hostile = hostile_replies(tmp_path, TOY)
    kinds = len(HOSTILE)
    assert hostile["kinds"] == kinds == 15
    assert hostile["tried"] == kinds  # one round per run, the bad site in each
    assert hostile["averaged"] == 0 and hostile["lost"] == 0
    assert hostile["runs_completed"] == kinds
    flaky = flaky_nodes(2, tmp_path, TOY)
    assert flaky["completed"] == 2 and flaky["lost"] == 0
    bad = bad_inputs(tmp_path)
    crash = {"injected": 0, "completed": 0, "lost": 0, "duplicated": 0, "max_diff": 0.0}
    dp = [{"clip": None, "noise": 0.0, "auc": 0.5, "worst": 0.25}]  # rendering input only
    text = render(crash, flaky, hostile, bad, dp, TOY, dp_rounds=1)
    assert f"| hostile replies (15 kinds × every round) | {kinds} | {kinds} / 15 | 0 |" in text
    assert "**0 averaged in**" in text
    tried, clear = (sum(column) for column in zip(*bad.values(), strict=True))
    assert f"| **all** | **{tried}** | **{clear}** (target all) |" in text
    assert tried == clear  # every bad input got an error naming what and where
    assert "| — | 0.0 | 0.500 | 0.250 |" in text and "1 rounds, I = 1, seed 11" in text
