"""Every experiment option trains the same through Flower's node path as in-process.

No Flower process runs here: ``FlowerLikeTransport`` has ``FlowerTransport``'s interface and
its message handling (frames through Flower records, so the header is JSON; tensors the node
holds sent as content tags, as its ``cached`` answers say), but hands each request to one
``NodeWorker`` per site file, as ``fed-auc node`` does. The Flower ServerApp's own
``run_experiment`` drives it (only its transport is another), and ``run_simulation`` runs the
same experiment on the same site files in-process. Both must end with the same server state
and exported model, and record the same rounds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from fed_auc.algorithms import ALGORITHMS
from fed_auc.coordinator.checkpoint import CHECKPOINT_FILE
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import load_state, load_torch
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore
from tests.support.data_files import write_npz
from tests.support.flower_like import _over_worker, _png_csv, _site_files

BASE = {
    "model": "tiny",
    "image_size": 16,
    "rounds": 2,
    "local_steps": 2,
    "batch_size": 8,
    "select": "last",
    "warmup_rounds": 0,  # image files warm up 10 rounds by default; "warmup" below asks for 1
}
OPTION_SETS = {
    **{name: {"algorithm": name} for name in sorted(ALGORITHMS)},
    "personal_l2": {"personalize": "l2"},
    "dp": {"dp_clip": 1.0, "dp_noise": 0.5},
    "dp_example": {"dp": "example", "dp_clip": 1.0, "target_epsilon": 8.0},
    "centered_clip": {
        "aggregation": "centered_clip:1",
        "algorithm": "coda_plus",
    },  # codasca refuses
    "eval_every_2": {"eval_every": 2, "rounds": 3},
    "crop_flip_tta": {"augment": "crop_flip", "tta": "flip"},
    "best_val_2": {"select": "best_val:2"},
    "multi_label": {"sites": "multi_label"},
    # beyond the experiment's options: each site file's own node settings, and the options
    # whose code differs most between the two coordinators
    "site_node_options": {"partial_training": True, "sites": "node_options"},
    "warmup": {"warmup_rounds": 1},
    # a site's own τ_i and a weak site in the warm-up too (it ran the experiment's τ before)
    "site_node_options_warmup": {
        "partial_training": True, "sites": "node_options", "warmup_rounds": 1
    },
    "participation_range": {"participation": 0.6, "local_steps_range": "1:3"},
}
NODE_OPTIONS = {  # [node] lines per site of the "node_options" federation
    "north": 'local_steps = 3\naugment = "crop_flip"\ntta = "none"\n',
    "east": "memory_budget = 0.15\n",  # partial training: the weak site trains a suffix
}
ROW_COLUMNS = ["round", "site", "status", "steps", "auc", "personal_auc", "trained_groups"]
ROUND_COLUMNS = ["round", "global_auc", "global_val_auc", "worst_site_auc"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, list[tuple[str, str]]]:
    """The image files once: (site name, data spec) per site, for each federation."""
    root = tmp_path_factory.mktemp("data")
    (root / "east").mkdir()
    single = [
        ("north", f"csv:{_png_csv(root / 'north', ['label'], seed=1)}"),
        ("south", f"csv:{_png_csv(root / 'south', ['label'], rows=36, seed=2)}"),
        ("east", f"medmnist:{write_npz(root / 'east' / 'site.npz', n=(24, 8, 8), seed=3)}"),
    ]
    labels = ["Cardiomegaly", "Edema"]
    multi = [
        (name, f"csv:{_png_csv(root / f'm_{name}', labels, seed=10 + i)}")
        for i, name in enumerate(["west", "central", "harbor"])
    ]
    return {"single": single, "multi_label": multi, "node_options": single}


def _recorded(summary: dict, runs: Path) -> dict:
    run_dir = Path(summary["run_dir"])
    with RunStore(runs) as store:
        rows = store.site_rounds(summary["run_id"]).sort_values(["round", "site"])
        rounds = store.rounds(summary["run_id"]).sort_values("round")
    return {
        "state": load_state(run_dir / CHECKPOINT_FILE)["state"],
        "model": load_torch(Path(summary["model_path"])),  # weights, AUC variables, labels
        "rows": rows[ROW_COLUMNS].reset_index(drop=True),
        "rounds": rounds[ROUND_COLUMNS].reset_index(drop=True),
    }


def _assert_same(got: Any, want: Any, where: str = "state") -> None:
    """Nested dicts/lists of tensors and numbers: equal up to float rounding."""
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=where)
    elif isinstance(want, dict):
        assert sorted(got) == sorted(want), where
        for key in want:
            _assert_same(got[key], want[key], f"{where}/{key}")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            _assert_same(a, b, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6, nan_ok=True), where
    else:
        assert got == want, where


def _assert_same_frame(got: pd.DataFrame, want: pd.DataFrame) -> None:
    numeric = [c for c in want.columns if pd.api.types.is_numeric_dtype(want[c])]
    other = [c for c in want.columns if c not in numeric]
    assert got[other].astype(str).values.tolist() == want[other].astype(str).values.tolist()
    assert got[numeric].to_numpy(float) == pytest.approx(
        want[numeric].to_numpy(float), rel=1e-5, abs=1e-6, nan_ok=True
    )


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_an_option_trains_the_same_through_node_workers_as_in_process(
    name, data, tmp_path, shared_dp_secret
):
    options = {**BASE, **OPTION_SETS[name]}
    federation = options.pop("sites", "single")
    node = NODE_OPTIONS if federation == "node_options" else {}
    files = _site_files(tmp_path / "sites", data[federation], node)

    expected = run_simulation(
        ExperimentConfig(
            **options, site_files=[str(f) for f in files], runs_dir=str(tmp_path / "sim")
        )
    )
    summary, transport = _over_worker(options, files, tmp_path / "flower")

    want = _recorded(expected, tmp_path / "sim")
    got = _recorded(summary, tmp_path / "flower")
    _assert_same(got["state"], want["state"])
    _assert_same(got["model"], want["model"], "exported")
    _assert_same_frame(got["rows"], want["rows"])
    _assert_same_frame(got["rounds"], want["rounds"])
    assert summary["selected_round"] == expected["selected_round"]
    assert summary.get("averaged_rounds") == expected.get("averaged_rounds")
    assert summary["exported_auc"] == pytest.approx(expected["exported_auc"], abs=1e-6)

    for key, value in options.items():  # the option reached the nodes as it was given
        if key in transport.setup:
            assert transport.setup[key] == value, key
    trained = got["rows"][got["rows"]["round"] > 0]
    statuses = set(trained["status"])
    if name == "participation_range":  # 2 of the 3 sites per round
        assert statuses == {"completed", "idle"}
    else:
        assert statuses == {"completed"}
    assert len(got["rounds"]) == options["rounds"] + 1
    evaluated = got["rounds"]["global_auc"].notna().tolist()
    if name == "eval_every_2":  # rounds 0, 2 and the last (3)
        assert evaluated == [True, False, True, True]
    else:
        assert all(evaluated)
    if name == "personal_l2":
        assert trained["personal_auc"].notna().all()
    if name == "best_val_2":  # the mean of two rounds, scored again by every node
        assert len(summary["averaged_rounds"]) == 2
    if name.startswith("site_node_options"):
        steps = {site: set(rows["steps"]) for site, rows in trained.groupby("site")}
        assert steps["north"] == {3} and steps["south"] == {2}  # north's own τ_i
        groups = summary["trained_groups"]
        assert 0 < len(groups["east"]) < len(groups["north"])  # the weak site: a suffix
    if name == "warmup":  # fedavg + CE first, recorded as its own run, in both stores
        assert _runs(tmp_path / "flower") == _runs(tmp_path / "sim") == 2
    if name == "multi_label":
        assert got["model"]["label_names"] == ["Cardiomegaly", "Edema"]
    # the frames carried tags: some tensors a node already held did not travel again
    assert any(tagged for kind, _, tagged in transport.requests if kind == "train")


def _runs(runs: Path) -> int:
    with RunStore(runs) as store:
        return len(store.runs())
