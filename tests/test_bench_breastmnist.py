"""benchmarks/breastmnist.py at toy size: the table it reports matches the runs it made."""

from __future__ import annotations

import importlib.util
import json
import re
import statistics
import sys
from pathlib import Path

import pytest

from fed_auc.store import RunStore
from tests.data_files import write_npz

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "breastmnist.py"


def load_script():
    spec = importlib.util.spec_from_file_location("bench_breastmnist", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


def test_rows_are_parsed_and_bad_ones_named() -> None:
    bench = load_script()
    assert bench.Row.parse("centralized:flip") == bench.Row("centralized", "flip")
    with pytest.raises(ValueError, match="row must be .* got 'federated'"):
        bench.Row.parse("federated")
    quick = bench.parse_args(["--quick"])
    assert quick.rounds < bench.FULL["rounds"] and len(quick.seeds) == 3


@pytest.mark.slow
def test_toy_run_reports_the_exported_rounds_auc(tmp_path: Path) -> None:
    bench = load_script()
    npz = write_npz(tmp_path / "toy.npz", n=(160, 40, 60))
    runs, out, md = tmp_path / "runs", tmp_path / "out.json", tmp_path / "frag.md"
    argv = ["--npz", str(npz), "--image-size", "16", "--rounds", "2", "--warmup-rounds", "1"]
    argv += ["--seeds", "0", "1", "--rows", "federated:flip", "--runs-dir", str(runs)]
    bench.main([*argv, "--out", str(out), "--markdown", str(md)])
    results = json.loads(out.read_text())["federated:flip"]
    assert [r["seed"] for r in results] == [0, 1]
    with RunStore(runs) as store:
        main_runs = store.runs().query("algorithm == 'codasca'")
        by_seed = {
            store.run(run_id)["config"]["seed"]: store.rounds(run_id).set_index("round")
            for run_id in main_runs["id"]
        }
        configs = [store.run(run_id)["config"] for run_id in main_runs["id"]]
    assert {c["augment"] for c in configs} == {"flip"}
    for r in results:
        assert 1 <= r["selected_round"] <= 2
        recorded = by_seed[r["seed"]].loc[r["selected_round"], "global_auc"]
        assert r["test_auc"] == pytest.approx(recorded)
    mean = statistics.mean(r["test_auc"] for r in results)
    sd = statistics.stdev(r["test_auc"] for r in results)
    text = md.read_text()
    assert f"**{mean:.3f} ± {sd:.3f}**" in text
    assert re.search(r"Command: `python benchmarks/breastmnist.py --npz ", text)
    assert "0.909 ± 0.012" in text and "Seeds: 0, 1" in text
