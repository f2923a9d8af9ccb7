"""benchmarks/rare_positives/positive_floor.py at toy size, and the fragment helper every benchmark
uses."""

from __future__ import annotations

from benchmarks.common import fragment
from benchmarks.rare_positives import positive_floor

TOY = {"sites": 2, "local_steps": 2, "image_size": 16, "data_scale": 0.2}


def test_floor_labels_count_positives_of_the_batch():
    assert positive_floor.floor_label(0.2, 32) == "0.20 (7 of 32)"  # ceil(6.4)
    assert positive_floor.floor_label(0.05, 32) == "**0.05 (2 of 32), the default**"
    assert positive_floor.floor_label(0.0, 32) == "none"


def test_toy_floors_table_shows_each_runs_aucs():
    results = {f: positive_floor.final_aucs(f, rounds=2, seed=0, **TOY) for f in (0.2, 0.0)}
    assert results[0.2] != results[0.0]  # the floor changes the batches, hence the model
    for pooled, worst in results.values():
        assert 0.0 <= worst <= 1.0 and 0.0 <= pooled <= 1.0
    text = positive_floor.table(results)
    assert text.count("\n") == 3  # header, rule, two rows
    assert f"| 0.20 (7 of 32) | {results[0.2][0]:.3f} | {results[0.2][1]:.3f} |" in text
    assert f"| none | {results[0.0][0]:.3f} | {results[0.0][1]:.3f} |" in text


def test_command_line_drops_only_the_fragment_path(tmp_path):
    argv = ["/x/benchmarks/systems/overhead.py", "--quick", "--markdown", "r/o.md", "--seed", "1"]
    quick = "python -m benchmarks.systems.overhead --quick --seed 1"
    assert fragment.command_line(argv) == quick
    assert fragment.command_line(["b/p.py", "--markdown=r.md"]) == "python -m benchmarks.p"
    fragment.emit("| a |\n", tmp_path / "results" / "p.md")
    assert (tmp_path / "results" / "p.md").read_text() == "| a |\n"
