"""``fed-auc predict --pacs``: the studies a query finds on a real Orthanc (DICOMweb, with a
login) are scored where they are, one SR per study is validated and stored back (STOW-RS),
and the PACS then returns it."""

from __future__ import annotations

import shutil
import subprocess

import pandas as pd
import pydicom
import pytest

from benchmarks.common.dicom_studies import make_studies, pacs_site_file, write_labels
from benchmarks.common.orthanc import PASSWORD, PASSWORD_ENV, start_orthanc
from fed_auc.cli import main
from fed_auc.data.dicomweb import Pacs, PacsSource
from fed_auc.site import SiteDefinition
from tests.support.predict_files import tiny_model


@pytest.fixture
def pacs(tmp_path, monkeypatch):
    """Orthanc with 4 patients' studies (one with two images), 2 more, and one study whose
    image cannot be decoded; a site file naming it."""
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    server = start_orthanc(tmp_path / "orthanc")
    images = make_studies(tmp_path / "dicom", patients=4, unlabelled=2, corrupt=True)
    for image in images:
        server.upload(image.path)
    labels = write_labels(tmp_path / "labels.csv", images)  # the site file needs one
    site = pacs_site_file(tmp_path, "radiology", server.dicomweb, labels, PASSWORD_ENV)
    yield server, images, site
    server.stop()


def test_predict_scores_a_pacs_query_and_stores_one_valid_sr_per_study_back(pacs, tmp_path):
    server, images, site = pacs
    model = tiny_model(tmp_path / "model", threshold=[0.5])
    out, sr_dir = tmp_path / "p.csv", tmp_path / "sr"
    code = main(["predict", "--model", str(model), "--pacs", str(site), "--out", str(out),
                 "--sr-dir", str(sr_dir), "--stow", "--store", str(tmp_path / "runs")])  # fmt: skip
    assert code == 3  # one image could not be read; the others were scored
    table = pd.read_csv(out, dtype=str, keep_default_na=False)
    broken = images[-1]
    failed = table[table["error"] != ""]
    assert len(table) == len(images) and len(failed) == 1
    assert broken.study in failed["path"].iloc[0] and "cannot" in failed["error"].iloc[0]
    studies = {i.study for i in images} - {broken.study}
    written = {pydicom.dcmread(p).StudyInstanceUID: p for p in sr_dir.iterdir()}
    assert set(written) == studies  # one per study with a scored image
    for path in written.values():
        done = subprocess.run(["dciodvfy", str(path)], capture_output=True, text=True)
        lines = (done.stdout + done.stderr).splitlines()
        assert [line for line in lines if line.startswith("Error")] == [], lines
    # the PACS returns them: found by QIDO-RS, fetched by WADO-RS, equal to what was written
    source = PacsSource.from_table(SiteDefinition.from_toml(site).data["pacs"], "test")
    client = Pacs(source).client
    stored = client.search_for_series(search_filters={"Modality": "SR"})
    assert len(stored) == len(studies)
    for study, path in written.items():
        local = pydicom.dcmread(path)
        (series,) = client.search_for_series(study, search_filters={"Modality": "SR"})
        series_uid = series["0020000E"]["Value"][0]
        fetched = client.retrieve_instance(study, series_uid, local.SOPInstanceUID)
        assert fetched.ContentSequence == local.ContentSequence
        assert fetched.PatientID == local.PatientID


def test_a_query_narrows_the_studies_and_bad_options_are_one_line(pacs, tmp_path):
    server, images, site = pacs
    model = tiny_model(tmp_path / "model")
    first = images[0]
    out = tmp_path / "one.csv"
    code = main(["predict", "--model", str(model), "--pacs", str(site), "--query",
                 f"PatientID={first.patient}", "--out", str(out),
                 "--store", str(tmp_path / "runs")])  # fmt: skip
    assert code == 0
    table = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert set(table["StudyInstanceUID"]) == {first.study}
    for args, message in (
        (["--images", str(tmp_path), "--stow"], "--stow stores the reports of --sr-dir"),
        (["--pacs", str(site), "--query", "PatientID"], "expected KEY=VALUE"),
        (["--images", str(tmp_path), "--query", "A=b"], "--query filters the studies of --pacs"),
    ):
        with pytest.raises(SystemExit, match=message):
            main(["predict", "--model", str(model), *args, "--out", str(tmp_path / "x.csv")])
    assert shutil.which("dciodvfy"), (
        "dicom3tools' dciodvfy validates SRs: apt-get install dicom3tools"
    )
