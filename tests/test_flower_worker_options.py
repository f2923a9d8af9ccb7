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

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from fed_auc.algorithms import ALGORITHMS
from fed_auc.coordinator.checkpoint import CHECKPOINT_FILE
from fed_auc.exchange import NodeFailure
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import load_state, load_torch
from fed_auc.node.setup import NodeSetup
from fed_auc.simulation import run_simulation
from fed_auc.site import SiteDefinition
from fed_auc.store.run_store import RunStore
from fed_auc.transport.flower import server
from fed_auc.transport.flower.client import frame_content, message_frame
from fed_auc.transport.flower.codec import (
    broadcast_frame,
    frame_evaluation,
    frame_reply,
    tensor_frame,
)
from fed_auc.transport.flower.worker import NodeWorker
from tests.data_files import write_npz

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
    "participation_range": {"participation": 0.6, "local_steps_range": "1:3"},
}
NODE_OPTIONS = {  # [node] lines per site of the "node_options" federation
    "north": 'local_steps = 3\naugment = "crop_flip"\ntta = "none"\n',
    "east": "memory_budget = 0.15\n",  # partial training: the weak site trains a suffix
}
ROW_COLUMNS = ["round", "site", "status", "steps", "auc", "personal_auc", "trained_groups"]
ROUND_COLUMNS = ["round", "global_auc", "global_val_auc", "worst_site_auc"]


# -- the transport -------------------------------------------------------------------------
class FlowerLikeTransport:
    """``FlowerTransport`` without Flower: the same frames, one in-process worker per site."""

    def __init__(self, site_files: list[Path], setup: NodeSetup) -> None:
        sites = [SiteDefinition.from_toml(path) for path in site_files]
        self.workers = {site.name: NodeWorker(site) for site in sites}
        self.setup = setup.to_dict()
        self.registrations: dict[str, dict[str, Any]] = {}
        self.summaries: dict[str, dict[str, Any]] = {}
        self.held: dict[str, list[str]] = {}  # content tags each node says it holds
        self.requests: list[tuple[str, int, int]] = []  # (kind, tensors sent, sent as tags)

    @property
    def sites(self) -> list[str]:
        return list(self.registrations)

    def use(self, setup: NodeSetup) -> FlowerLikeTransport:
        self.setup = setup.to_dict()
        return self

    def register(self) -> dict[str, dict[str, Any]]:
        if self.registrations:
            return self.registrations
        request = {"kind": "register", "setup": self.setup}
        answers = {site: self._ask(site, (request, [])) for site in self.workers}
        for site in sorted(answers, key=lambda s: answers[s][0]["registration"]["order"]):
            self.registrations[site] = answers[site][0]["registration"]
            self.summaries[site] = answers[site][0]["summary"]
        return self.registrations

    def train(self, requests):
        memo: dict[int, str] = {}
        return {
            site: self._decode(
                site,
                frame_reply,
                self._ask(site, broadcast_frame(b, self.setup, self.held.get(site, []), memo)),
            )
            for site, b in requests.items()
        }

    def evaluate(self, sites, tensors, pooled=True, thresholds=None):
        header = {"kind": "evaluate", "setup": self.setup, "pooled": pooled}
        if thresholds is not None:  # as FlowerTransport.evaluate: bins around the threshold
            header["thresholds"] = list(thresholds)
        memo: dict[int, str] = {}
        return {
            site: self._decode(
                site,
                frame_evaluation,
                self._ask(site, tensor_frame(header, tensors, self.held.get(site, []), memo)),
            )
            for site in sites
        }

    def _ask(self, site: str, frame):
        """One request as a Flower message's content, answered as ``fed-auc node`` answers it."""
        header, buffers = message_frame(frame_content(*frame))
        index = header.get("index", [])
        self.requests.append((header["kind"], len(index), sum(e[3] == -1 for e in index)))
        try:
            answer = message_frame(frame_content(*self.workers[site].handle(header, buffers)))
        except Exception as exc:  # a Flower error reply
            self.held.pop(site, None)
            return NodeFailure(site, "error", f"{type(exc).__name__}: {exc}")
        self.held[site] = answer[0].get("cached", [])
        return answer

    @staticmethod
    def _decode(site, decode, answer):
        if isinstance(answer, NodeFailure):
            return answer
        return decode(answer)


# -- site files ----------------------------------------------------------------------------
def _png_csv(folder: Path, labels: list[str], rows: int = 30, seed: int = 0) -> Path:
    """A CSV of 16 px PNGs with a split column (train 4 : val 1 : test 1); every label has
    both classes in every split. The first label brightens the centre, the second the top."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(rows):
        block = i // 6
        values = [int(block % 2 == 0), int(block % 3 == 1)][: len(labels)]
        pixels = rng.normal(90, 30, (16, 16))
        pixels[5:11, 5:11] += 60 * values[0]
        if len(values) > 1:
            pixels[:4] += 60 * values[1]
        rel = f"img/{i:03d}.png"
        (folder / "img").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(folder / rel)
        split = ("train", "train", "train", "train", "val", "test")[i % 6]
        lines.append(
            {"Path": rel, **dict(zip(labels, map(str, values), strict=True)), "split": split}
        )
    path = folder / "labels.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(lines[0]))
        writer.writeheader()
        writer.writerows(lines)
    return path


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


def _site_files(root: Path, sites: list[tuple[str, str]], node: dict[str, str]) -> list[Path]:
    root.mkdir()
    files = []
    for index, (name, spec) in enumerate(sites):
        path = root / f"{name}.toml"
        path.write_text(
            f'name = "{name}"\n\n[data]\nspec = "{spec}"\n\n'
            f'[node]\nstate_dir = "state/{name}"\nindex = {index}\n{node.get(name, "")}'
        )
        files.append(path)
    return files


# -- the two runs --------------------------------------------------------------------------
def _over_worker(options: dict, files: list[Path], runs: Path) -> tuple:
    """The Flower coordinator's ``run_experiment``, its transport swapped for ours."""
    made: list[FlowerLikeTransport] = []

    def transport(grid, setup, settings, log, event):
        made.append(FlowerLikeTransport(files, setup))
        return made[-1]

    config = {**options, "transport": "flower", "runs_dir": str(runs)}
    flower = {"expected_sites": len(files), "min_nodes": len(files), "insecure": True}
    flower["pooled_scoring"] = True  # as in-process: pooled AUCs and thresholds
    with RunStore(runs) as store:
        run_id = store.create_run(options.get("algorithm", "codasca"), config, None)
    experiment = {"experiment": config, "flower": flower, "run_id": run_id}
    summary = server.run_experiment(None, experiment, lambda line: None, transport)
    return summary, made[0]


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
    if name == "site_node_options":
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
