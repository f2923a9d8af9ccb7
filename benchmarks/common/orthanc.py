"""A real PACS for tests and benchmarks: Debian's Orthanc with its DICOMweb plugin, on loopback,
with a login.

``.ci/run`` installs ``orthanc`` and ``orthanc-dicomweb``; a machine without them fails the
tests that need it with that instruction (never a silent skip).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from fed_auc.transport.flower.processes import free_port

PLUGIN = Path("/usr/share/orthanc/plugins/libOrthancDicomWeb.so")
USER, PASSWORD = "fed-auc", "the PACS password of user fed-auc"  # as hospitals/README.md
PASSWORD_ENV = "FED_AUC_TEST_PACS_PASSWORD"


@dataclass
class Orthanc:
    """A running Orthanc: its DICOMweb root and REST root (both need the login)."""

    process: subprocess.Popen
    port: int
    folder: Path

    @property
    def rest(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def dicomweb(self) -> str:
        return f"{self.rest}/dicom-web"

    def upload(self, path: Path) -> dict:
        """Store one DICOM file (Orthanc's REST API: the test's setup, not what fed-auc uses)."""
        answer = requests.post(
            f"{self.rest}/instances", data=path.read_bytes(), auth=(USER, PASSWORD), timeout=30
        )
        answer.raise_for_status()
        return answer.json()

    def studies(self) -> list[str]:
        answer = requests.get(f"{self.rest}/studies", auth=(USER, PASSWORD), timeout=30)
        answer.raise_for_status()
        return answer.json()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)


def start_orthanc(folder: Path) -> Orthanc:
    """Start Orthanc on a free loopback port with its database in ``folder``."""
    binary = shutil.which("Orthanc") or "/usr/sbin/Orthanc"
    if not Path(binary).exists() or not PLUGIN.exists():
        raise RuntimeError(
            "these tests need Debian's Orthanc and its DICOMweb plugin: "
            "apt-get install orthanc orthanc-dicomweb (as .ci/run does)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = {
        "Name": "fed-auc-test-pacs",
        "StorageDirectory": str(folder / "db"),
        "IndexDirectory": str(folder / "db"),
        "HttpPort": port,
        "DicomServerEnabled": False,
        "RemoteAccessAllowed": False,
        "AuthenticationEnabled": True,
        "RegisteredUsers": {USER: PASSWORD},
        "Plugins": [str(PLUGIN)],
        "DicomWeb": {"Enable": True, "Root": "/dicom-web/", "StudiesMetadata": "Full"},
        "StableAge": 1,
    }
    (folder / "orthanc.json").write_text(json.dumps(config))
    log = (folder / "orthanc.log").open("w")
    process = subprocess.Popen(
        [binary, str(folder / "orthanc.json")], stdout=log, stderr=subprocess.STDOUT
    )
    server = Orthanc(process, port, folder)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"Orthanc exited: {(folder / 'orthanc.log').read_text()[-2000:]}")
        try:
            if requests.get(f"{server.dicomweb}/studies", auth=(USER, PASSWORD), timeout=2).ok:
                return server
        except requests.exceptions.ConnectionError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"Orthanc did not answer in 60 s: {(folder / 'orthanc.log').read_text()}")
