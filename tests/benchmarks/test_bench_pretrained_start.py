"""The --init benchmark's tables: each CODASCA arm paired by seed with its FedAvg-CE control at
the same total rounds, and the round-0 check against each registered model's card."""

from __future__ import annotations

from pathlib import Path

from benchmarks.claims.pretrained_start import (
    ARMS,
    CE_INIT,
    CE_TOTAL,
    INIT,
    WARM,
    cli,
    tables,
)


def _card(test: float, val: float = 0.7, stage: str = "main") -> dict:
    selected = [{"stage": stage, "round": 3}]
    return {"global_auc": test, "global_val_auc": val, "selected": selected}


def test_each_contender_is_paired_with_its_equal_budget_control() -> None:
    results = {
        seed: {
            **{arm: _card(0.60 + seed / 100) for arm in ARMS},
            INIT: _card(0.65 + seed / 50, stage="initial"),
            CE_TOTAL: _card(0.70 + seed / 100, val=0.8),
            "registered": _card(0.55),
            "round0": 0.55,
        }
        for seed in (0, 1, 2)
    }
    rows = [("MONAI state_dict (.pt)", 0.5, 0.25, 0.5)]
    text = tables(results, rows, warmup=5, rounds=15)
    assert "| MONAI state_dict (.pt) | 0.50 | 0.25 | 2.00 | 0.500 |" in text
    assert "card test AUC: yes (3 of 3 seeds" in text
    assert f"| {CE_TOTAL} | 20 | 0.800 ± 0.000 | 0.710 ± 0.010 | 0 of 3 |" in text
    assert f"| {INIT} | 20 | 0.700 ± 0.000 | 0.670 ± 0.020 | 3 of 3 |" in text
    # INIT − CE_TOTAL per seed: −0.05, −0.04, −0.03; INIT − CE_INIT: +0.05, +0.06, +0.07
    assert f"| {INIT} | {CE_TOTAL} | -0.040 [-0.065, -0.015] | 0 of 3 |" in text
    assert f"| {INIT} | {CE_INIT} | +0.060 [+0.035, +0.085] | 3 of 3 |" in text
    assert f"| {WARM} | {CE_TOTAL} | -0.100 [-0.100, -0.100] | 0 of 3 |" in text
    assert len([line for line in text.splitlines() if " | control at " in line]) == 1
    results[1]["round0"] = 0.56
    assert "card test AUC: NO" in tables(results, rows)


def test_every_arm_runs_the_same_federation_and_seed(tmp_path: Path) -> None:
    command = cli(tmp_path, 3, "--algorithm", "codasca")
    assert command[command.index("--seed") + 1] == "3"
    assert "imratio:0.05,0.05,0.05,0.05" in command and "--positive-label" in command
    assert command[command.index("--early-stop") + 1] == "0"  # every arm trains its budget
