"""A hospital whose images live in its PACS trains over Flower: its node fetches the labelled
studies from a real Orthanc (DICOMweb, with a login) and the federation's model equals
``fed-auc simulate`` on the same images as files. ``fed-auc evaluate`` scores the PACS site as
it scores the same files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from benchmarks.common.dicom_studies import (
    files_site_file,
    make_studies,
    pacs_site_file,
    write_files_csv,
    write_labels,
)
from benchmarks.common.orthanc import PASSWORD, PASSWORD_ENV, start_orthanc
from fed_auc.cli import main
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import load_torch
from fed_auc.simulation import run_simulation
from fed_auc.transport.flower.processes import free_port
from tests.support.flower_files import _coordinator, _fed_auc, _store, _summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SKIP = "skip_bad_images = true"  # the undecodable study: a warning, the others train
EXPERIMENT = {"algorithm": "codasca", "model": "tiny", "rounds": 2, "local_steps": 2,
              "batch_size": 8, "image_size": 28, "lr": 0.1, "select": "last"}  # fmt: skip


def _as_files(root: Path, name: str, csv: Path, extra: str = "") -> Path:
    """A files site with the PACS site's name (its batches are seeded by the name)."""
    path = files_site_file(root, f"{name}_files", csv, extra)
    text = path.read_text().replace(f'name = "{name}_files"', f'name = "{name}"')
    path.write_text(text)
    return path


def test_a_node_trains_from_its_pacs_as_from_the_same_files(tmp_path, monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)  # the node's environment: its PACS password
    server = start_orthanc(tmp_path / "orthanc")
    nodes = []
    try:
        # labelled studies, two without a label, one labelled that cannot be decoded
        images = make_studies(tmp_path / "dicom", corrupt=True)
        for image in images:
            server.upload(image.path)
        labels = write_labels(tmp_path / "labels.csv", images, splits=True)
        pacs = pacs_site_file(
            tmp_path, "radiology", server.dicomweb, labels, PASSWORD_ENV, extra=SKIP
        )
        files = write_files_csv(tmp_path / "radiology.csv", images, splits=True)
        other_images = make_studies(tmp_path / "other_dicom", patients=20, unlabelled=0)
        other = files_site_file(
            tmp_path, "clinic", write_files_csv(tmp_path / "clinic.csv", other_images, True)
        )
        port = free_port()
        nodes = [
            _fed_auc(tmp_path, f"{f.stem}.log", "node", "--site", str(f), "--insecure",
                     "--coordinator", f"127.0.0.1:{port}")
            for f in (pacs, other)
        ]  # fmt: skip
        coordinator = _coordinator(
            tmp_path, port, "flower", EXPERIMENT, expected_sites=2, min_nodes=2
        )
        summary = _summary(tmp_path, "flower", coordinator)
    finally:
        for node in nodes:
            node.terminate()
        for node in nodes:
            node.wait(timeout=60)
        server.stop()
    expected = run_simulation(
        ExperimentConfig(
            **EXPERIMENT,
            site_files=[str(_as_files(tmp_path, "radiology", files, SKIP)), str(other)],
            runs_dir=str(tmp_path / "sim"),
        )  # fmt: skip
    )
    model = load_torch(Path(summary["model_path"]))["state_dict"]
    for name, tensor in load_torch(Path(expected["model_path"]))["state_dict"].items():
        torch.testing.assert_close(model[name], tensor, atol=1e-5, rtol=1e-5)
    assert summary["global_auc"] == pytest.approx(expected["global_auc"], abs=1e-6)
    log = (tmp_path / "radiology.log").read_text()
    assert "Traceback" not in log
    fetched = list((tmp_path / "state" / "radiology").rglob("pacs/*/*.dcm"))
    assert len(fetched) == sum(i.label is not None for i in images)  # unlabelled: not fetched
    _, sites, _ = _store(tmp_path / "flower", summary["run_id"])
    read = sum(sites["radiology"][split]["n"] for split in ("train", "val", "test"))
    assert read == len(fetched) - 1  # the undecodable one was skipped, the others read


def test_evaluate_scores_a_pacs_site_as_it_scores_the_same_files(tmp_path, monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    server = start_orthanc(tmp_path / "orthanc")
    try:
        images = make_studies(tmp_path / "dicom", patients=30)
        for image in images:
            server.upload(image.path)
        labels = write_labels(tmp_path / "labels.csv", images, splits=True)
        pacs = pacs_site_file(tmp_path, "radiology", server.dicomweb, labels, PASSWORD_ENV)
        files = _as_files(
            tmp_path, "radiology", write_files_csv(tmp_path / "r.csv", images, splits=True)
        )
        trained = run_simulation(
            ExperimentConfig(**EXPERIMENT, site_files=[str(files)], runs_dir=str(tmp_path / "run"))
        )
        results = {}
        for name, site in (("pacs", pacs), ("files", files)):
            out = tmp_path / f"eval_{name}"
            args = ["evaluate", "--model", trained["model_path"], "--site", str(site),
                    "--bootstrap", "50", "--out", str(out),
                    "--runs-dir", str(tmp_path / name)]  # fmt: skip
            assert main(args) == 0
            results[name] = json.loads((out / "evaluation.json").read_text())
    finally:
        server.stop()
        os.environ.pop(PASSWORD_ENV, None)
    (label,) = results["files"]["label_names"]
    got, want = (
        results["pacs"]["sites"]["radiology"][label],
        results["files"]["sites"]["radiology"][label],
    )
    assert got["n"] == want["n"] > 0
    assert got["auc"] == pytest.approx(want["auc"], abs=1e-12)
