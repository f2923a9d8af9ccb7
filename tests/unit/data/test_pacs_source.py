"""A site whose images live in a PACS: a real Orthanc (DICOMweb) on loopback holds studies the
test made (labelled, unlabelled, one that cannot be decoded, one labelled but missing)."""

from __future__ import annotations

import json
import shutil
import stat

import numpy as np
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
from fed_auc.data.memmap import gather
from fed_auc.data.pacs_source import FOLDER, INSTANCES_FILE
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import load_torch
from fed_auc.simulation import run_simulation
from fed_auc.site import SiteDefinition
from fed_auc.transport.flower.processes import free_port

pytestmark = pytest.mark.filterwarnings("ignore:.*have no row in.*:UserWarning")


@pytest.fixture(scope="module")
def pacs(tmp_path_factory):
    """Orthanc holding 24 labelled patients' studies and 2 unlabelled ones."""
    root = tmp_path_factory.mktemp("pacs")
    server = start_orthanc(root / "orthanc")
    images = make_studies(root / "dicom")
    for image in images:
        server.upload(image.path)
    yield server, images, root
    server.stop()


@pytest.fixture
def password(monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)


def _site(tmp_path, server, images, name="pacs", **options):
    labels = write_labels(tmp_path / f"{name}_labels.csv", images)
    return SiteDefinition.from_toml(
        pacs_site_file(tmp_path, name, server.dicomweb, labels, PASSWORD_ENV, **options)
    )


def _same_data(a, b):
    for split in ("train", "val", "test"):
        x, y = getattr(a, split), getattr(b, split)
        assert len(x) == len(y) > 0
        torch.testing.assert_close(x.labels, y.labels)
        torch.testing.assert_close(gather(x.images), gather(y.images), atol=0, rtol=0)


def test_a_pacs_site_reads_the_same_images_labels_and_splits_as_the_same_files(
    pacs, tmp_path, password
):
    server, images, _ = pacs
    site = _site(tmp_path, server, images)
    files = SiteDefinition.from_toml(
        files_site_file(tmp_path, "files", write_files_csv(tmp_path / "files.csv", images))
    )
    got, want = site.load(28), files.load(28)
    _same_data(got, want)
    assert got.meta["source"] == f"dicomweb:{server.dicomweb}"
    assert got.meta["pacs"] == {"url": server.dicomweb, "query": {}}
    labelled = [i for i in images if i.label is not None]
    fetched = sorted((site.cache_dir / FOLDER).glob("*/*.dcm"))
    assert len(fetched) == len(labelled)  # the unlabelled studies are not fetched
    assert {p.stem for p in fetched} == {i.sop for i in labelled}
    # private to the node's user, as the image cache
    assert {stat.S_IMODE(p.stat().st_mode) for p in fetched} == {0o600}
    assert stat.S_IMODE((site.cache_dir / FOLDER).stat().st_mode) == 0o700


def test_images_are_fetched_once_and_a_pacs_that_is_down_later_leaves_the_site_usable(
    tmp_path, password
):
    server = start_orthanc(tmp_path / "orthanc")
    try:
        images = make_studies(tmp_path / "dicom", patients=12, unlabelled=0)
        for image in images:
            server.upload(image.path)
        site = _site(tmp_path, server, images)
        first = site.load(28)
        fetched = {p: p.stat().st_mtime_ns for p in (site.cache_dir / FOLDER).glob("*/*.dcm")}
    finally:
        server.stop()
    with pytest.warns(UserWarning, match="cannot reach the PACS at .*using the instances"):
        again = site.load(28)  # the server is gone: what was fetched is used
    _same_data(again, first)
    assert {p: p.stat().st_mtime_ns for p in fetched} == fetched  # not fetched again
    kept = json.loads((site.cache_dir / FOLDER / INSTANCES_FILE).read_text())
    assert kept["url"] == server.dicomweb and len(kept["instances"]) == len(images)


def test_a_labelled_study_the_pacs_lacks_is_named_by_its_line_and_uid(pacs, tmp_path, password):
    server, images, _ = pacs
    labels = write_labels(tmp_path / "labels.csv", images)
    lines = labels.read_text().splitlines()
    missing = "1.2.826.0.1.3680043.10.1452.3.999.1"
    labels.write_text("\n".join([*lines[:3], f"{missing},1", *lines[3:]]) + "\n")
    path = pacs_site_file(tmp_path, "gaps", server.dicomweb, labels, PASSWORD_ENV)
    with pytest.raises(ValueError, match=rf"labels.csv line 4: SOPInstanceUID {missing} is not on"):
        SiteDefinition.from_toml(path).load(28)
    skipping = pacs_site_file(
        tmp_path, "gaps2", server.dicomweb, labels, PASSWORD_ENV, extra="skip_bad_images = true"
    )
    with pytest.warns(UserWarning, match="1 labelled image.* not on the PACS"):
        data = SiteDefinition.from_toml(skipping).load(28)
    assert len(data.train) + len(data.val) + len(data.test) == len(lines) - 1


def test_a_study_that_cannot_be_decoded_is_named(tmp_path, password):
    server = start_orthanc(tmp_path / "orthanc")
    try:
        images = make_studies(tmp_path / "dicom", patients=12, unlabelled=0, corrupt=True)
        for image in images:
            server.upload(image.path)
        broken = images[-1]
        site = _site(tmp_path, server, images)
        with pytest.raises(ValueError, match=rf"cannot read image .*/{broken.study}/[0-9.]+\.dcm"):
            site.load(28)
    finally:
        server.stop()


def test_an_unreachable_pacs_a_refused_login_and_a_missing_password_are_one_line_each(
    pacs, tmp_path, monkeypatch
):
    server, images, _ = pacs
    labels = write_labels(tmp_path / "labels.csv", images)
    nowhere = f"http://127.0.0.1:{free_port()}/dicom-web"
    cases = [
        (nowhere, PASSWORD, rf"cannot reach the PACS at {nowhere} to find studies"),
        (server.dicomweb, "wrong", r"refused the login \(401\) to find studies .*'fed-auc'"),
        (server.dicomweb, None, rf"environment variable {PASSWORD_ENV}, which is not set"),
    ]
    for i, (url, secret, message) in enumerate(cases):
        if secret is None:
            monkeypatch.delenv(PASSWORD_ENV, raising=False)
        else:
            monkeypatch.setenv(PASSWORD_ENV, secret)
        site = SiteDefinition.from_toml(
            pacs_site_file(tmp_path, f"s{i}", url, labels, PASSWORD_ENV)
        )
        with pytest.raises(ValueError, match=message) as caught:
            site.load(28)
        assert "\n" not in str(caught.value)


def test_a_pacs_table_is_checked_when_the_site_file_is_read(tmp_path):
    labels = tmp_path / "labels.csv"
    cases = {
        'url = "pacs.local"\n': "url = 'pacs.local': the DICOMweb root",
        'url = "http://x/dicom-web"\nusername = "u"\n': "username and password_env go together",
        'url = "http://x/dicom-web"\nquery = "DX"\n': "a table of QIDO-RS filters",
        'url = "http://x/dicom-web"\nport = 1\n': r"unknown \[data.pacs\] key\(s\) \['port'\]",
    }
    for i, (table, message) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.toml"
        path.write_text(
            f'name = "bad{i}"\n[data]\nspec = "dicomweb:{labels}"\n[data.pacs]\n{table}'
        )
        with pytest.raises(ValueError, match=message):
            SiteDefinition.from_toml(path)
    path = tmp_path / "nopacs.toml"
    path.write_text(f'name = "nopacs"\n[data]\nspec = "dicomweb:{labels}"\n')
    with pytest.raises(ValueError, match=r"\[data.pacs\] .* goes with spec = 'dicomweb"):
        SiteDefinition.from_toml(path)


@pytest.mark.slow
def test_simulate_from_the_pacs_trains_the_same_model_as_from_the_same_files(
    pacs, tmp_path, password
):
    server, images, _ = pacs
    pacs_file = pacs_site_file(
        tmp_path,
        "pacs",
        server.dicomweb,
        write_labels(tmp_path / "l.csv", images, splits=True),
        PASSWORD_ENV,
    )
    files = write_files_csv(tmp_path / "files.csv", images, splits=True)
    shutil.copy(files, tmp_path / "files2.csv")
    other = files_site_file(tmp_path, "other", tmp_path / "files2.csv")
    experiment = {"algorithm": "codasca", "model": "tiny", "rounds": 2, "local_steps": 2,
                  "batch_size": 8, "image_size": 28, "lr": 0.1, "select": "last"}  # fmt: skip
    from_pacs = run_simulation(
        ExperimentConfig(
            **experiment, site_files=[str(pacs_file), str(other)], runs_dir=str(tmp_path / "a")
        )  # fmt: skip
    )
    same_files = files_site_file(tmp_path, "pacs_files", files)  # another name: its own state
    text = same_files.read_text().replace('name = "pacs_files"', 'name = "pacs"')
    same_files.write_text(text.replace("state/pacs_files", "state/files_as_pacs"))
    from_files = run_simulation(
        ExperimentConfig(
            **experiment, site_files=[str(same_files), str(other)], runs_dir=str(tmp_path / "b")
        )  # fmt: skip
    )
    got = load_torch(from_pacs["model_path"])["state_dict"]
    for name, tensor in load_torch(from_files["model_path"])["state_dict"].items():
        torch.testing.assert_close(got[name], tensor, atol=0, rtol=0)
    assert from_pacs["global_auc"] == pytest.approx(from_files["global_auc"], abs=1e-12)
    assert np.all(np.isfinite(from_pacs["global_auc"]))


def test_a_bearer_token_is_sent_and_a_refused_one_is_named(monkeypatch):
    """A DICOMweb service behind OAuth (a cloud DICOM store): a stand-in server on loopback
    answers QIDO-RS only to the right bearer token."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from fed_auc.data.dicomweb import Pacs, PacsSource

    seen = []

    class Service(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(self.headers.get("Authorization"))
            good = self.headers.get("Authorization") == "Bearer good-token"
            body = b"[]" if good else b""
            self.send_response(200 if good else 401)
            self.send_header("Content-Type", "application/dicom+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/dicom-web"
        source = PacsSource.from_table(
            {"url": url, "token_env": "FED_AUC_TEST_TOKEN", "attempts": 1}, "test"
        )
        monkeypatch.setenv("FED_AUC_TEST_TOKEN", "good-token")
        assert Pacs(source).find_instances() == []
        monkeypatch.setenv("FED_AUC_TEST_TOKEN", "stolen")
        with pytest.raises(ValueError, match="refused the login .*bearer token of FED_AUC_TEST"):
            Pacs(source).find_instances()
        assert seen == ["Bearer good-token", "Bearer stolen"]
        monkeypatch.delenv("FED_AUC_TEST_TOKEN")
        with pytest.raises(ValueError, match="FED_AUC_TEST_TOKEN, which is not set"):
            Pacs(source)
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ValueError, match="instead of username and password_env"):
        PacsSource.from_table(
            {"url": url, "token_env": "T", "username": "u", "password_env": "P"}, "test"
        )
