"""benchmarks/anchors/libauc_breastmnist.py at toy size: the splits it feeds LibAUC and the row it
picks."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.anchors import libauc_breastmnist as bench
from tests.support.data_files import write_npz

HAS_LIBAUC = (bench.LIBAUC_DIR / "libauc").is_dir()


def test_splits_are_the_files_own_at_32_px_in_three_channels(tmp_path: Path) -> None:
    npz = write_npz(tmp_path / "toy.npz", n=(30, 10, 12))
    data = bench.load_splits(npz, 32)
    raw = np.load(npz)
    for name, (images, labels) in (("train", data.train), ("val", data.val), ("test", data.test)):
        assert images.shape == (len(raw[f"{name}_labels"]), 3, 32, 32)
        assert torch.equal(images[:, 0], images[:, 2]) and 0 <= images.min() <= images.max() <= 1
        assert labels.flatten().tolist() == raw[f"{name}_labels"].flatten().tolist()


def test_a_multi_label_file_is_refused_by_name(tmp_path: Path) -> None:
    npz = write_npz(tmp_path / "multi.npz", labels=3)
    with pytest.raises(ValueError, match=r"multi\.npz: 3 labels; this reference is binary"):
        bench.load_splits(npz, 32)


def test_jobs_below_one_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--npz", str(tmp_path / "x.npz"), "--jobs", "0"])
    assert "--jobs must be at least 1, got 0" in capsys.readouterr().err


def test_the_table_reports_each_seed_and_the_mean() -> None:
    results = [
        {"seed": s, "ce_val_auc": 0.8, "ce_test_auc": 0.7, "best_epoch": 3, "val_auc": v,
         "test_auc": t, "last_test_auc": 0.5, "seconds": 120.0}
        for s, v, t in ((0, 0.9, 0.85), (1, 0.95, 0.95))
    ]  # fmt: skip
    text = bench.markdown(results, bench.QUICK, Path("toy.npz"), 240.0)
    assert "| 0 | 0.800 / 0.700 | 3 | 0.900 | 0.850 | 0.500 | 2.0 |" in text
    assert "**0.900 ± 0.071** over 2 seed(s)" in text and "seeds 0 1" in text


@pytest.mark.skipif(not HAS_LIBAUC, reason="LibAUC not installed in benchmarks/.libauc")
def test_one_seed_trains_both_phases_and_reports_the_best_validation_epoch(
    tmp_path: Path,
) -> None:
    npz = write_npz(tmp_path / "toy.npz", n=(40, 16, 16))
    recipe = replace(bench.QUICK, ce_epochs=1, auc_epochs=3, batch_size=8, eval_batch_size=16)
    result = bench.run_seed(npz, recipe, seed=0)
    log = result["auc_log"]
    assert [e["epoch"] for e in log] == [1, 2, 3]
    best = max(log, key=lambda e: e["val_auc"])
    assert (result["best_epoch"], result["val_auc"], result["test_auc"]) == (
        best["epoch"], best["val_auc"], best["test_auc"],
    )  # fmt: skip
    assert result["last_test_auc"] == log[-1]["test_auc"]
    assert all(0 <= e["test_auc"] <= 1 for e in log) and result["seconds"] > 0
    assert json.loads(json.dumps(result)) == result  # what --json writes
    assert "torchvision" not in sys.modules  # the import stub did not outlive the import
