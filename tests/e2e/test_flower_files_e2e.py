"""Three hospitals train on their own image files over Flower, as `fed-auc simulate` does.

Each site is one site file next to its own images: a CSV of PNGs, a CSV of DICOMs (half of
them MONOCHROME1, stored inverted) and a MedMNIST ``.npz``. The experiment uses what a real
federation needs at once: CODASCA, partial training (one weak site), personal heads and a
fedavg + cross-entropy warm-up. The Flower run must equal ``fed-auc simulate`` on the same
three site files: the exported model, and the rows the store keeps (site rounds, ROC points,
personal AUC, trained groups, data summaries). A node that starts failing mid-run is recorded
as an error event and the rounds go on with the others (k of n).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import pytest
import torch

from app.pages import ROUND_PAGES
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import load_torch
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore
from fed_auc.transport.flower.processes import free_port
from tests.support.apptest import open_page
from tests.support.data_files import write_npz
from tests.support.flower_files import (
    _coordinator,
    _csv_site,
    _fed_auc,
    _site_file,
    _store,
    _summary,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EXPERIMENT = {  # the network and lr pinned: image files otherwise get the recipe's `small`
    "algorithm": "codasca",
    "model": "tiny",
    "lr": 0.1,
    "rounds": 2,
    "warmup_rounds": 2,
    "local_steps": 2,
    "batch_size": 8,
    "image_size": 28,
    "partial_training": True,
    "personalize": "head",
    "select": "last",
}
SITES = ("pngs", "dicoms", "npz")
COLUMNS = ["round", "site", "status", "steps", "n", "auc", "val_auc", "personal_auc"]
COLUMNS += ["update_norm", "bytes_up", "bytes_down"]
NUMERIC = [c for c in COLUMNS if c not in ("site", "status")]


@pytest.fixture(scope="module")
def hospitals(tmp_path_factory):
    """The three site files and one `fed-auc node` per site (no TLS: loopback only)."""
    root = tmp_path_factory.mktemp("hospitals")
    _csv_site(root, "pngs", 48, dicom=False)
    _csv_site(root, "dicoms", 48, dicom=True)
    (root / "npz").mkdir()
    write_npz(root / "npz" / "site.npz", n=(40, 12, 16))
    files = [
        _site_file(root, "pngs", "csv:pngs/labels.csv"),
        _site_file(root, "dicoms", "csv:dicoms/labels.csv", budget=0.15),  # the weak site
        _site_file(root, "npz", "medmnist:npz/site.npz"),
    ]
    port = free_port()
    nodes = [
        _fed_auc(root, f"{f.stem}.log", "node", "--site", str(f), "--insecure",
                 "--coordinator", f"127.0.0.1:{port}")
        for f in files
    ]  # fmt: skip
    yield root, files, port
    for node in nodes:
        node.terminate()
    for node in nodes:
        node.wait(timeout=60)


def _rounds_recorded(runs: Path) -> int:
    if not (runs / "fed_auc.sqlite").exists():
        return 0
    with RunStore(runs) as store:
        ids = store.runs()["id"]
        return 0 if ids.empty else len(store.rounds(ids.iloc[0])) - 1  # round 0 too


def test_three_hospitals_on_their_own_files_equal_simulate_on_the_same_site_files(
    hospitals, monkeypatch
):
    root, files, port = hospitals
    summary = _summary(root, "flower", _coordinator(root, port, "flower", EXPERIMENT))
    config = ExperimentConfig(
        **EXPERIMENT, site_files=[str(f) for f in files], runs_dir=str(root / "sim")
    )
    expected = run_simulation(config)

    model = load_torch(Path(summary["model_path"]))
    for name, tensor in load_torch(Path(expected["model_path"]))["state_dict"].items():
        torch.testing.assert_close(model["state_dict"][name], tensor, atol=1e-5, rtol=1e-5)
    assert summary["global_auc"] == pytest.approx(expected["global_auc"], abs=1e-6)
    assert summary["trained_groups"] == expected["trained_groups"]
    weak = summary["trained_groups"]["dicoms"]
    assert weak and len(weak) < len(summary["trained_groups"]["pngs"])  # a suffix only

    got, got_sites, events = _store(root / "flower", summary["run_id"])
    want, want_sites, _ = _store(root / "sim", expected["run_id"])
    assert got[["site", "status"]].values.tolist() == want[["site", "status"]].values.tolist()
    assert got[NUMERIC].to_numpy(float) == pytest.approx(
        want[NUMERIC].to_numpy(float), abs=1e-5, nan_ok=True
    )
    trained = got[got["round"] > 0]
    assert trained["personal_auc"].notna().all()  # scored on each node, head never sent
    assert got["trained_groups"].tolist() == want["trained_groups"].tolist()
    metrics = zip(got["metrics"].map(json.loads), want["metrics"].map(json.loads), strict=True)
    for mine, theirs in metrics:
        assert mine["roc"] and len(mine["roc"]) == len(theirs["roc"])  # ROC points, per label
        for ours, expected_roc in zip(mine["roc"], theirs["roc"], strict=True):
            for key in ("fpr", "tpr", "thresholds"):
                assert ours[key] == pytest.approx(expected_roc[key], abs=1e-5)
    for site in SITES:  # the nodes' data summaries, computed on the node
        ours, theirs = got_sites[site], want_sites[site]
        for split in ("train", "val", "test"):
            assert ours[split]["n"] == theirs[split]["n"] > 0
            assert ours[split]["positives"] == theirs[split]["positives"]
            assert math.isclose(ours[split]["intensity_mean"], theirs[split]["intensity_mean"])
    assert {got_sites[s]["source"].split(":")[0] for s in SITES} == {"csv", "medmnist"}
    messages = " ".join(events["message"])
    assert all(f"site {s} joined after" in messages for s in SITES)  # with the waiting time
    assert "warm start: 2 fedavg+CE rounds" in messages
    with RunStore(root / "flower") as store:
        runs = store.runs()
    assert set(runs["algorithm"]) == {"codasca", "fedavg"}  # the warm-up is its own run
    # The image-file recipe reached the deployed run: the equal models above were trained
    # with the warm-up's head recentered and α's step scaled to the registered prevalence.
    with RunStore(root / "flower") as store:
        recorded = store.run(summary["run_id"])["config"]
    assert recorded["warmup_head"] == "recenter"
    assert recorded["backend_options"]["dual_lr"] == "prevalence"
    # Every dashboard page shows the deployed run as it shows the simulated one.
    for page in ROUND_PAGES:
        shown = {}
        for name, run in (("flower", summary["run_id"]), ("sim", expected["run_id"])):
            at = open_page(monkeypatch, root / name, page.key, run)
            shown[name] = (len(at.get("vega_lite_chart")), len(at.info), len(at.metric))
        assert shown["flower"] == shown["sim"], page.key
    roc = open_page(monkeypatch, root / "flower", "roc", summary["run_id"])
    assert "stores no ROC points" not in " ".join(str(i.value) for i in roc.info)


def test_a_node_that_fails_is_an_error_event_and_the_rounds_go_on_without_it(hospitals):
    root, files, port = hospitals
    options = {"rounds": 8, "local_steps": 2, "batch_size": 8, "select": "last"}
    coordinator = _coordinator(root, port, "failing", options)
    deadline = time.monotonic() + 400
    while _rounds_recorded(root / "failing") < 1:  # the store is written as rounds end
        assert coordinator.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    # The npz node can no longer save its local state: its next training requests fail.
    runs = [p for p in (root / "state" / "npz").iterdir() if p.is_dir() and p.name != "flwr_home"]
    run_dir = max(runs, key=lambda p: p.stat().st_mtime)  # this run's local state
    shutil.rmtree(run_dir)
    run_dir.write_text("not a directory")
    summary = _summary(root, "failing", coordinator)

    rows, _, events = _store(root / "failing", summary["run_id"])
    failed = rows[(rows["site"] == "npz") & (rows["status"] == "error")]
    assert len(failed) >= 1
    for round_ in failed["round"]:  # the others completed those rounds
        others = rows[(rows["round"] == round_) & (rows["site"] != "npz")]
        assert (others["status"] == "completed").all()
    errors = events[(events["site"] == "npz") & (events["level"] == "error")]
    assert errors["message"].str.contains("train: error").any()
    with RunStore(root / "failing") as store:
        assert store.run(summary["run_id"])["status"] == "completed"


def test_a_coordinator_stopped_while_it_waits_for_nodes_marks_its_run_failed(tmp_path):
    """SIGTERM before any node joined: the run is failed (resumable), never left running."""
    port = free_port()
    coordinator = _coordinator(tmp_path, port, "waiting", {"rounds": 2}, expected_sites=2)
    deadline = time.monotonic() + 300
    log = tmp_path / "waiting.log"
    while "waiting for 2 site(s)" not in (log.read_text() if log.exists() else ""):
        assert coordinator.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.3)
    coordinator.terminate()
    assert coordinator.wait(timeout=120) != 0
    with RunStore(tmp_path / "waiting") as store:
        run_id = store.runs()["id"].iloc[0]
        assert store.run(run_id)["status"] == "failed"
        messages = store.events(run_id)["message"].tolist()
    assert any("coordinator stopped" in m and f"--resume {run_id}" in m for m in messages)
    assert not _listening(port)  # its SuperLink is gone with it


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
