"""One DICOM SR per study: dicom3tools' validator finds no error in it, and what it says
(score, probability, decision, the images it is about) is what the CSV says."""

from __future__ import annotations

import shutil
import subprocess

import highdicom as hd
import pandas as pd
import pydicom
import pytest

from fed_auc.cli import main
from fed_auc.predict.report_sr import PROBABILITY, SCORE
from fed_auc.store.run_store import RunStore
from tests.support.data_files import write_png
from tests.support.predict_files import tiny_model, write_study_dicom

STUDIES = {"1.2.826.0.1.3680043.8.498.1": "P1", "1.2.826.0.1.3680043.8.498.2": "P2"}


@pytest.fixture
def predicted(tmp_path, capsys):
    """2 studies × 2 DICOM images and a PNG, predicted with a calibrated model and SRs."""
    root = tmp_path / "images"
    for s, (study, patient) in enumerate(STUDIES.items()):
        for i in range(2):
            write_study_dicom(root / f"s{s}" / f"{i}.dcm", study, patient, seed=10 * s + i)
    write_png(root / "photo.png", 100, seed=5)
    calibration = [{"label": "label", "method": "isotonic", "x": [0.0, 1.0], "y": [0.05, 0.95]}]
    model_dir = tiny_model(tmp_path / "model", calibration=calibration, threshold=[0.5])
    out, sr_dir = tmp_path / "p.csv", tmp_path / "sr"
    code = main(["predict", "--model", str(model_dir), "--images", str(root), "--out", str(out),
                 "--sr-dir", str(sr_dir), "--store", str(tmp_path / "runs")])  # fmt: skip
    assert code == 0
    return pd.read_csv(out, dtype=str, keep_default_na=False), sr_dir, capsys.readouterr().out


def test_one_report_per_study_and_a_png_is_told_it_has_none(predicted, tmp_path):
    table, sr_dir, printed = predicted
    assert sorted(p.name for p in sr_dir.iterdir()) == sorted(f"{s}.dcm" for s in STUDIES)
    assert "1 scored image(s) are not DICOM" in printed
    assert "structured reports: 2 in" in printed
    with RunStore(tmp_path / "runs") as store:
        assert store.predictions()["sr_count"].tolist() == [2]
    for study, patient in STUDIES.items():
        sr = pydicom.dcmread(sr_dir / f"{study}.dcm")
        assert (sr.StudyInstanceUID, sr.PatientID, sr.Modality) == (study, patient, "SR")


def test_dciodvfy_finds_no_error(predicted):
    _, sr_dir, _ = predicted
    assert shutil.which("dciodvfy"), (
        "dicom3tools' dciodvfy validates SRs: apt-get install dicom3tools"
    )
    for path in sr_dir.iterdir():
        done = subprocess.run(["dciodvfy", str(path)], capture_output=True, text=True)
        lines = (done.stdout + done.stderr).splitlines()
        assert lines and lines[0].strip() == "Comprehensive3DSR"  # it read the IOD
        assert [line for line in lines if line.startswith("Error")] == []


def _texts(item, found=None) -> dict[str, set[str]]:
    """Every TEXT item below ``item``: concept code value → its texts."""
    found = {} if found is None else found
    for child in item.get("ContentSequence", []):
        if child.ValueType == "TEXT":
            code = child.ConceptNameCodeSequence[0].CodeValue
            found.setdefault(code, set()).add(child.TextValue)
        _texts(child, found)
    return found


def _numbers(group, name) -> list[float]:
    return [float(m.value) for m in group.get_measurements(name=name)]


def test_the_report_says_what_the_csv_says(predicted):
    table, sr_dir, _ = predicted
    rows = table.set_index("SOPInstanceUID")
    seen = []
    for path in sr_dir.iterdir():
        sr = hd.sr.Comprehensive3DSR.from_dataset(pydicom.dcmread(path))
        groups = sr.content.get_image_measurement_groups()
        assert len(groups) == 2  # the study's two images, one label
        for group in groups:
            (image,) = group.source_images
            uid = image.referenced_sop_instance_uid
            row = rows.loc[uid]
            assert row["StudyInstanceUID"] == path.stem
            assert _numbers(group, SCORE) == [float(row["finding_score"])]
            assert _numbers(group, PROBABILITY) == [float(row["finding_probability"])]
            (decision,) = group.get_qualitative_evaluations()
            assert decision.value.meaning.lower() == row["finding_decision"]
            assert decision.name.meaning == row["finding_positive_class"]
            texts = _texts(group[0])  # TID 4019: algorithm name 111001, version 111003
            assert texts["111001"] == {"fed-auc"} and texts["111003"] == {row["model_run_id"]}
            assert texts["111002"] == {f"model.pt SHA-256 {row['model_sha256']}"}
            seen.append(uid)
    assert sorted(seen) == sorted(table.loc[table["SOPInstanceUID"] != "", "SOPInstanceUID"])
