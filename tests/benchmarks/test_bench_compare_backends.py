"""benchmarks/claims/compare_backends.py at toy size: same local work, bytes and AUC gain per MB."""

from __future__ import annotations

import pytest

from benchmarks.claims import compare_backends

TOY = {"sites": 2, "rounds": 2, "local_steps_range": "1:3", "image_size": 16, "data_scale": 0.2}


def test_toy_backends_do_the_same_work_and_the_table_shows_it():
    results = {name: compare_backends.run(name, seed=0, **TOY) for name in ("fedavg", "codasca")}
    fedavg, codasca = results["fedavg"], results["codasca"]
    assert fedavg["steps"] == codasca["steps"]  # τ_i drawn per site and round, not per backend
    assert 2 * 2 * 1 <= codasca["steps"] <= 2 * 2 * 3
    assert codasca["mb"] > fedavg["mb"] > 0  # control variates and reference travel too
    for r in results.values():
        assert r["gain_per_mb"] == pytest.approx((r["auc"] - r["auc0"]) / r["mb"])
        assert 0.0 <= r["worst"] <= 1.0 and r["auc"] <= r["best"] <= 1.0
    text = compare_backends.table(results)
    r = codasca
    assert (
        f"| codasca | {r['auc']:.3f} (best {r['best']:.3f}) | {r['worst']:.3f} | {r['mb']:.1f} "
        f"| {r['gain_per_mb']:.4f} | {r['steps']} |"
    ) in text
    assert len(text.splitlines()) == 4


def test_every_backend_has_a_row():
    from fed_auc.algorithms import ALGORITHMS

    assert set(compare_backends.ORDER) <= set(ALGORITHMS) and len(compare_backends.ORDER) == 8
