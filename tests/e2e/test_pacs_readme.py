"""hospitals/README.md's "Images from your PACS" and "Using a trained model", run as written
against the tests' Orthanc: its site file (only the port differs), its labels layout, its
`export` and every `fed-auc` command of the two sections."""

from __future__ import annotations

import re
import shlex

import pandas as pd
import pytest

from benchmarks.common.dicom_studies import make_studies, write_labels
from benchmarks.common.orthanc import start_orthanc
from fed_auc.cli import main
from fed_auc.data.dicomweb import Pacs, PacsSource
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.simulation import run_simulation
from fed_auc.site import SiteDefinition
from tests.support.paths import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
WRITTEN = "http://127.0.0.1:8042/dicom-web"


def _sections() -> str:
    text = (ROOT / "hospitals" / "README.md").read_text()
    return text[text.index("## Images from your PACS") : text.index("## A GPU node")]


def _blocks(text: str, kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", text, re.S)


def test_the_pacs_sections_of_the_site_guide_run_as_written(tmp_path, monkeypatch):
    text = _sections()
    site_toml = _blocks(text, "toml")[0]
    assert WRITTEN in site_toml
    server = start_orthanc(tmp_path / "orthanc")
    try:
        images = make_studies(tmp_path / "dicom", patients=30)
        for image in images:
            server.upload(image.path)
        monkeypatch.chdir(tmp_path)
        (tmp_path / "radiology.toml").write_text(site_toml.replace(WRITTEN, server.dicomweb))
        header = re.search(r"```\n(SOPInstanceUID,.*)\n", text)[1]  # the labels' layout
        labels = write_labels(tmp_path / "radiology_labels.csv", images, splits=True)
        assert pd.read_csv(labels).columns[:2].tolist() == header.split(",")
        for line in "\n".join(_blocks(text, "bash")).splitlines():
            if line.startswith("export "):
                name, _, value = line.removeprefix("export ").partition("=")
                monkeypatch.setenv(name, shlex.split(value)[0])
        trained = run_simulation(
            ExperimentConfig(
                algorithm="codasca",
                model="tiny",
                rounds=2,
                local_steps=2,
                batch_size=8,
                image_size=28,
                site_files=["radiology.toml"],
                runs_dir="runs",
            )  # fmt: skip
        )
        model = trained["model_path"].removesuffix("/model.pt")
        commands = [
            shlex.split(line.split("  #")[0].replace("runs/<run>/model", model))
            for line in "\n".join(_blocks(text, "bash")).splitlines()
            if line.startswith("fed-auc ")
        ]
        assert [c[1] for c in commands] == ["node", "predict", "export"]
        for command in commands:
            assert main(command[1:]) == 0, command
        stored = Pacs(
            PacsSource.from_table(SiteDefinition.from_toml("radiology.toml").data["pacs"], "t")
        ).client.search_for_series(search_filters={"Modality": "SR"})
    finally:
        server.stop()
    predictions = pd.read_csv(tmp_path / "predictions.csv", dtype=str, keep_default_na=False)
    assert len(predictions) == len(images) and (predictions["error"] == "").all()
    studies = {i.study for i in images}
    assert len(list((tmp_path / "reports").iterdir())) == len(stored) == len(studies)
    assert {p.name for p in (tmp_path / "deploy").iterdir()} >= {"model.ts", "model.onnx", "bundle"}
