"""The --init benchmark's table: arms paired by seed with CODASCA from random, and the
round-0 check against each registered model's card."""

from __future__ import annotations

from pathlib import Path

from benchmarks.claims.pretrained_start import ARMS, cli, tables


def _card(test: float, val: float = 0.7) -> dict:
    return {"global_auc": test, "global_val_auc": val}


def test_arms_are_paired_with_random_start_and_round_zero_is_checked() -> None:
    results = {
        seed: {
            ARMS[0]: _card(0.60 + seed / 100),
            ARMS[1]: _card(0.70 + seed / 100),
            ARMS[2]: _card(0.65 + seed / 50),
            "registered": _card(0.55),
            "round0": 0.55,
        }
        for seed in (0, 1, 2)
    }
    rows = [("MONAI state_dict (.pt)", 0.5, 0.25, 0.5)]
    text = tables(results, rows)
    assert "| MONAI state_dict (.pt) | 0.50 | 0.25 | 2.00 | 0.500 |" in text
    assert "card test AUC: yes (3 of 3 seeds" in text
    assert f"| {ARMS[1]} | 0.700 ± 0.000 | 0.710 ± 0.010 | +0.100 [+0.100, +0.100] |" in text
    results[1]["round0"] = 0.56
    assert "card test AUC: NO" in tables(results, rows)


def test_every_arm_runs_the_same_federation_and_seed(tmp_path: Path) -> None:
    command = cli(tmp_path, 3, "--algorithm", "codasca")
    assert command[command.index("--seed") + 1] == "3"
    assert "imratio:0.05,0.05,0.05,0.05" in command and "--positive-label" in command
