"""benchmarks/rare_positives/dual_step.py: the table's paired difference and its interval."""

from __future__ import annotations

import math

from benchmarks.rare_positives.dual_step import SETTINGS, command, paired_ci, table


def test_paired_ci_of_constant_differences_has_zero_width_and_brackets_the_mean():
    assert paired_ci([0.02, 0.02, 0.02]) == (0.02, 0.02, 0.02)
    mean, lo, hi = paired_ci([0.01, -0.03, 0.05, 0.0])
    assert lo < mean < hi and math.isclose(mean, 0.0075)


def test_table_pairs_seeds_with_the_paper_setting(tmp_path):
    paper, dual = list(SETTINGS)
    results = {
        paper: {0: {"val_auc": 0.8, "test_auc": 0.7}, 1: {"val_auc": 0.9, "test_auc": 0.8}},
        dual: {0: {"val_auc": 0.85, "test_auc": 0.7}, 1: {"val_auc": 0.95, "test_auc": 0.8}},
    }
    text = table("synthetic", results)
    assert "+0.050 [+0.050, +0.050]" in text and "+0.000 [+0.000, +0.000]" in text
    assert "dual_lr=" not in " ".join(command("synthetic", 3, 0, None, tmp_path))
    assert "dual_lr=0.5" in command("synthetic", 3, 0, 5.0, tmp_path)
