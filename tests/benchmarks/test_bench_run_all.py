"""benchmarks/run_all.py: fragments land between their markers, nothing else changes."""

from __future__ import annotations

import importlib.util

import pytest

from benchmarks import run_all

DOC = "# B\n\nprose before\n<!-- results:x -->\nold table\n<!-- /results:x -->\nprose after\n"


def test_splice_replaces_only_the_marked_fragment():
    out = run_all.splice(DOC, "x", "| new |\n|---|\n")
    assert out == DOC.replace("old table\n", "| new |\n|---|\n")
    assert run_all.splice(out, "x", "again") == DOC.replace("old table", "again")
    with pytest.raises(KeyError, match="results:y"):
        run_all.splice(DOC, "y", "t")


def test_place_writes_into_the_document_with_the_markers(tmp_path):
    first, second = tmp_path / "A.md", tmp_path / "B.md"
    first.write_text("no markers\n")
    second.write_text(DOC)
    assert run_all.place("x", "t1", (first, second)) == second
    assert "t1" in second.read_text() and first.read_text() == "no markers\n"
    with pytest.raises(KeyError, match="'z'"):
        run_all.place("z", "t", (first, second))


def test_every_benchmark_has_its_script_and_markers():
    documents = "".join(p.read_text() for p in run_all.DOCUMENTS)
    for benchmark in run_all.BENCHMARKS:
        assert importlib.util.find_spec(benchmark.module) is not None, benchmark.module
        assert f"<!-- results:{benchmark.name} -->" in documents, benchmark.name
        assert f"<!-- /results:{benchmark.name} -->" in documents, benchmark.name


def test_a_missing_data_file_skips_the_benchmark(tmp_path):
    absent = run_all.Benchmark(
        "breastmnist", "benchmarks.anchors.breastmnist", needs=tmp_path / "none.npz"
    )
    outcome, seconds = run_all.run(absent, quick=True)
    assert outcome.startswith("skipped") and seconds == 0.0
