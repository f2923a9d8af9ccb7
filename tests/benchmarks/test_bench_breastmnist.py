"""benchmarks/anchors/breastmnist.py at toy size: the table it reports matches the runs it made."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from benchmarks.anchors import breastmnist as bench
from fed_auc.data.base import Split
from fed_auc.data.medmnist import load_medmnist
from fed_auc.evaluate.local import evaluate_model
from fed_auc.registry.load import load_registered_model
from fed_auc.store.run_store import RunStore
from tests.support.data_files import write_npz


def test_rows_are_parsed_and_bad_ones_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.Row.parse("centralized:flip") == bench.Row("centralized", "flip")
    with pytest.raises(ValueError, match="row must be .* got 'federated'"):
        bench.Row.parse("federated")
    quick = bench.parse_args(["--quick"])
    assert quick.rounds < bench.FULL["rounds"] and len(quick.seeds) == 3
    assert quick.model == "tiny" and bench.parse_args([]).model == "small"
    assert bench.parse_args(["--model", "tiny"]).model == "tiny"
    with pytest.raises(SystemExit):
        bench.parse_args(["--jobs", "0"])
    assert "--jobs must be at least 1, got 0" in capsys.readouterr().err


CHOSEN = "; ".join(["warm-up round 1 (fedavg + ce) and rounds [1, 2]"] * 2)  # both seeds


@pytest.mark.slow
def test_toy_run_reports_the_exported_rounds_auc(tmp_path: Path) -> None:
    npz = write_npz(tmp_path / "toy.npz", n=(160, 40, 60))
    runs, out, md = tmp_path / "runs", tmp_path / "out.json", tmp_path / "frag.md"
    argv = ["--npz", str(npz), "--image-size", "16", "--rounds", "2", "--warmup-rounds", "1"]
    argv += ["--model", "tiny", "--batch-size", "8"]
    argv += ["--seeds", "0", "1", "--rows", "federated:flip", "--runs-dir", str(runs)]
    argv += ["--jobs", "2"]  # both seeds at once; results still in seed order
    bench.main([*argv, "--out", str(out), "--markdown", str(md)])
    results = json.loads(out.read_text())["federated:flip"]
    assert [r["seed"] for r in results] == [0, 1]
    with RunStore(runs) as store:
        main_runs = store.runs().query("algorithm == 'codasca'")
        run_dirs = {
            store.run(run_id)["config"]["seed"]: runs / run_id for run_id in main_runs["id"]
        }
        configs = [store.run(run_id)["config"] for run_id in main_runs["id"]]
    assert {c["augment"] for c in configs} == {"flip"}
    pool = load_medmnist(npz, image_size=16)
    test = pool.split == "test"
    for r in results:
        # the defaults for image files: the mean of the best 5 rounds of the whole run (here:
        # the warm-up's one and the run's two), flip TTA
        assert r["selection"] == "best_val:5" and r["tta"] == "flip"
        assert r["selected_round"] == 2 and r["averaged_rounds"] == [1, 1, 2]
        assert r["exported"] == "warm-up round 1 (fedavg + ce) and rounds [1, 2]"
        model, card = load_registered_model(run_dirs[r["seed"]] / "model")
        sites = {"all": Split(pool.images[test], pool.labels[test])}
        scored = evaluate_model(model, card, sites, n_boot=0)["sites"]["all"]["label"]["auc"]
        assert r["test_auc"] == pytest.approx(scored)
        assert r["val_auc"] == card["global_val_auc"]
    mean = statistics.mean(r["test_auc"] for r in results)
    sd = statistics.stdev(r["test_auc"] for r in results)
    text = md.read_text()
    assert f"**{mean:.3f} ± {sd:.3f}**" in text
    assert re.search(r"Command: `python -m benchmarks.anchors.breastmnist --npz ", text)
    assert "0.909 ± 0.012" in text and "Seeds: 0, 1" in text
    assert "| best_val:5, flip |" in text and f"| {CHOSEN} |" in text
    val = statistics.mean(r["val_auc"] for r in results)
    assert f"| {val:.3f} | {CHOSEN} |" in text
