"""benchmarks/systems/synthetic_difficulty.py at toy size: every cell of its table is a measured
AUC."""

from __future__ import annotations

import pytest

from benchmarks.systems import synthetic_difficulty as sd


@pytest.mark.slow
def test_toy_table_cells_are_the_measured_numbers():
    results = sd.per_seed([0, 1], steps=3, test_scale=1, scale=0.3)
    multi = sd.multilabel(0, steps=3, test_scale=1, scale=0.3)
    assert list(multi) == list(sd.FINDINGS)
    generation = {28: (2310, 0.25), 64: (2310, 1.0)}  # input: any times render as given
    text = sd.table(results, 3, multi, 3, generation)
    rows = dict(line.strip("| ").split(" | ", 1) for line in text.splitlines()[2:])
    r0, r1 = results[0], results[1]
    for run in (r0, r1):
        values = [run["intensity"], run["logistic"], *run["cnn"].values(), *run["shift"].values()]
        assert all(0.0 <= v <= 1.0 for v in values)
    assert rows["logistic regression on raw pixels"] == (
        f"{r0['logistic']:.3f} / {r1['logistic']:.3f}"
    )
    per_site = rows["same, per site (lowest–highest over seeds)"]
    low, high = sorted([r0["cnn"]["mercy_rural"], r1["cnn"]["mercy_rural"]])
    assert f"mercy_rural {low:.3f}–{high:.3f}" in per_site
    shift = next(v for k, v in rows.items() if k.startswith("trained on st_elsewhere"))
    assert f"{r1['shift']['home']:.3f} → {r1['shift']['shifted']:.3f}" in shift
    assert f"opacity {multi['opacity']:.3f}" in next(
        v for k, v in rows.items() if k.startswith("multi-label (5 findings), 3 steps")
    )
    assert rows["generating 4 sites (2,310 images), 28 px / 64 px"] == "0.25 s / 1.00 s"
