"""benchmarks/claims/communication.py at toy size: I_max as defined, and CODASCA = CODA+ at I =
1."""

from __future__ import annotations

import pytest

from benchmarks.claims import communication


def test_i_max_is_the_largest_window_within_the_tolerance_of_i_1():
    aucs = {1: 0.80, 4: 0.795, 16: 0.785, 64: 0.792, 256: 0.70}
    assert communication.i_max(aucs) == 64  # 16 is 0.015 below, 64 within 0.01 again
    assert communication.i_max({1: 0.8, 4: 0.7}) == 1


def test_toy_sweep_table_and_plot(tmp_path):
    results = communication.sweep(
        [2], [0], [1, 4], workers=1, steps=4, image_size=16, data_scale=0.05, batch_size=4
    )
    assert set(results) == {(2, a, i, 0) for a in communication.ALGORITHMS for i in (1, 4)}
    assert all(0.0 <= auc <= 1.0 for auc in results.values())
    # CODASCA with I = 1 and η_g = 1 is CODA+ with I = 1 (CODASCA notes, §2): same model
    assert results[2, "codasca", 1, 0] == pytest.approx(results[2, "coda_plus", 1, 0], abs=1e-6)
    text = communication.table(results, [0])
    best = {a: communication.i_max({i: results[2, a, i, 0] for i in (1, 4)}) for a in ("codasca",)}
    assert f"| codasca | {results[2, 'codasca', 1, 0]:.3f} |" in text
    assert f"**{best['codasca']}**" in text
    communication.plot(results, tmp_path / "auc.png")
    assert (tmp_path / "auc.png").stat().st_size > 1000
