"""benchmarks/claims/partial_and_personal.py at toy size: memory fractions, per-site means and
minima."""

from __future__ import annotations

import pytest

from benchmarks.claims import partial_and_personal as pp

TOY = {
    "rounds": 1, "local_steps": 2, "image_size": 16, "data_scale": 0.2, "seed": 0, "batch_size": 16
}  # fmt: skip


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip("| ").split(" | ")]


def test_memory_table_fractions_are_totals_over_the_full_step():
    text = pp.memory_section(batch=4, cases=[("tiny", 28)])
    rows = [
        cells(line) for line in text.splitlines() if line.startswith("| ") and "---" not in line
    ]
    header, body = rows[0], rows[1:]
    assert header[0] == "trains from" and body[0][0] == "stem" and body[-1][0] == "classifier"
    totals = [float(r[4]) for r in body]
    assert [int(r[1]) for r in body] == list(range(len(body), 0, -1))  # one group fewer per row
    assert totals == sorted(totals, reverse=True) and float(body[0][5]) == 1.0
    for row in body:  # rounding: the fraction is of unrounded totals
        assert float(row[5]) == pytest.approx(float(row[4]) / totals[0], abs=0.01)


@pytest.mark.slow
def test_toy_personal_table_mean_and_worst_are_of_its_cells():
    plain = pp._run(**TOY)
    text = pp.personal_section(TOY, plain)
    rows = [cells(line) for line in text.splitlines()[2:]]
    assert len(rows) == 5 and rows[0][0] == "global model (plain CODASCA)"
    assert rows[0][1:-2] == [f"{v:.3f}" for v in plain["site_auc"].values()]
    for row in rows:
        values = [float(v) for v in row[1:-2]]
        assert float(row[-2]) == pytest.approx(sum(values) / len(values), abs=0.0015)
        assert float(row[-1]) == min(values)


@pytest.mark.slow
def test_toy_partial_table_names_the_trained_groups():
    plain = pp._run(**TOY)
    text = pp.partial_section(TOY, plain)
    assert text.startswith("Trained groups per site: ")
    table = [cells(line) for line in text.splitlines()[4:]]
    assert len(table) == 4
    assert table[0][1:3] == [f"{plain['global_auc'][-1]:.3f}", f"{plain['worst_site_auc'][-1]:.3f}"]
    for row in table:
        assert float(row[2]) == min(float(v) for v in row[3:])  # worst site is a site's AUC
