"""Studies a test makes for its PACS: DICOM files of patients with one or two images each, the
same images as a CSV site of files, and a labels CSV keyed by UID for the PACS site."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class StudyImage:
    path: Path
    patient: str
    study: str
    series: str
    sop: str
    label: int | None  # None: no label (on the PACS, not in the labels CSV)


def write_instance(
    path: Path, pixels: np.ndarray, patient: str, study: str, series: str, sop: str,
    truncated: bool = False,
) -> None:  # fmt: skip
    """A 16-bit DX-like Secondary Capture instance with the patient and study attributes a
    PACS needs; ``truncated``: its pixel data is cut short (a file no decoder can read)."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = sop
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = SecondaryCaptureImageStorage, sop
    ds.PatientID, ds.PatientName = patient, f"Test^{patient}"
    ds.PatientBirthDate, ds.PatientSex = "19600101", "O"
    ds.StudyInstanceUID, ds.SeriesInstanceUID = study, series
    ds.StudyDate, ds.StudyTime, ds.StudyID, ds.AccessionNumber = "20261101", "120000", "1", "A1"
    ds.ReferringPhysicianName = ""
    ds.Modality, ds.SeriesNumber, ds.InstanceNumber = "OT", 1, 1
    ds.ConversionType = "WSD"
    ds.Rows, ds.Columns = pixels.shape
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated = ds.BitsStored = 16
    ds.HighBit = 15
    ds.PixelRepresentation = 0
    data = pixels.astype(np.uint16).tobytes()
    ds.PixelData = data[: len(data) // 2] if truncated else data
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)


def make_studies(
    folder: Path, patients: int = 24, unlabelled: int = 2, corrupt: bool = False, size: int = 16
) -> list[StudyImage]:
    """``patients`` labelled patients (a third positive, brighter in the centre), one study
    each with one image (every fourth has two), ``unlabelled`` more without a label, and
    optionally one labelled study whose image cannot be decoded (its label last)."""
    rng = np.random.default_rng(7)
    root = "1.2.826.0.1.3680043.10.1452"
    images: list[StudyImage] = []
    total = patients + unlabelled + int(corrupt)
    for p in range(total):
        label = int(p % 3 == 0) if p < patients or (corrupt and p == total - 1) else None
        study, series = f"{root}.1.{p + 1}", f"{root}.2.{p + 1}"
        for i in range(2 if p % 4 == 0 else 1):
            sop = f"{root}.3.{p + 1}.{i + 1}"
            pixels = rng.integers(200, 1800, (size, size))
            if label:
                pixels[size // 3 : 2 * size // 3, size // 3 : 2 * size // 3] += 1500
            path = folder / f"p{p:03d}_{i}.dcm"
            broken = corrupt and p == total - 1
            write_instance(path, pixels, f"P{p:03d}", study, series, sop, truncated=broken)
            images.append(StudyImage(path, f"P{p:03d}", study, series, sop, label))
    return images


def split_of(image: StudyImage) -> str:
    """A split by patient with both classes in validation and test (for a split column)."""
    return {1: "val", 2: "test"}.get(int(image.patient[1:]) % 5, "train")


def write_labels(
    path: Path, images: list[StudyImage], key: str = "SOPInstanceUID", splits: bool = False
) -> Path:
    """The labels CSV of the labelled images, keyed by ``key`` (one row per study when the key
    is StudyInstanceUID); ``splits``: with a split column (``split_of``)."""
    rows, seen = [], set()
    for image in images:
        if image.label is None:
            continue
        uid = image.sop if key == "SOPInstanceUID" else image.study
        if uid in seen:
            continue
        seen.add(uid)
        rows.append({key: uid, "label": str(image.label)})
        if splits:
            rows[-1]["split"] = split_of(image)
    return _write(path, rows)


def write_files_csv(path: Path, images: list[StudyImage], splits: bool = False) -> Path:
    """The same labelled images as a CSV site of files, in the order the PACS site reads them
    (labels file order, a study's images by UID), with the DICOM PatientID as patient id."""
    rows = [
        {"Path": str(image.path), "label": str(image.label), "patient_id": image.patient,
         **({"split": split_of(image)} if splits else {})}
        for image in images
        if image.label is not None
    ]  # fmt: skip
    return _write(path, rows)


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def pacs_site_file(
    folder: Path, name: str, url: str, labels: Path, password_env: str | None,
    user: str = "fed-auc", extra: str = "",
) -> Path:  # fmt: skip
    """A site file whose images come from the PACS at ``url``."""
    login = f'username = "{user}"\npassword_env = "{password_env}"\n' if password_env else ""
    path = folder / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\n\n[data]\nspec = "dicomweb:{labels}"\n{extra}\n'
        f'[data.pacs]\nurl = "{url}"\nkey = "SOPInstanceUID"\ntimeout_s = 10\n'
        f"attempts = 1\n{login}\n"
        f'[node]\nstate_dir = "state/{name}"\n'
    )
    return path


def files_site_file(folder: Path, name: str, csv_path: Path, extra: str = "") -> Path:
    """A site file of the same images as files (``extra``: more [data] lines)."""
    path = folder / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\n\n[data]\nspec = "csv:{csv_path}"\nimages_outside_root = true\n'
        f'{extra}\n\n[node]\nstate_dir = "state/{name}"\n'
    )
    return path
