"""What the prediction tests score: a tiny registered model (written in the registry format,
no training) and DICOM instances that belong to studies (patient and study attributes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from fed_auc.exchange import MODEL_FORMAT
from fed_auc.io import save_json, save_torch
from fed_auc.models import build_model

DX = "1.2.840.10008.5.1.4.1.1.1.1"  # Digital X-Ray Image Storage - For Presentation


def tiny_model(
    folder: Path,
    labels: tuple[str, ...] = ("finding",),
    tta: str = "flip",
    threshold: list[float] | None = None,
    calibration: list[dict[str, Any]] | None = None,
    size: int = 16,
    seed: int = 0,
) -> Path:
    """``folder/model.pt`` + ``model_card.json`` of an untrained tiny DenseNet (seeded): what
    ``fed_auc.registry.export`` writes, with the card fields scoring reads."""
    torch.manual_seed(seed)
    model = build_model("tiny", len(labels)).eval()
    folder.mkdir(parents=True, exist_ok=True)
    card: dict[str, Any] = {
        "run_id": "run-tiny", "label_names": list(labels),
        "positive_class": [f"{label} present" for label in labels], "image_size": size,
        "tta": tta, "threshold": threshold or [0.5] * len(labels),
    }  # fmt: skip
    if calibration is not None:
        card["calibration"] = calibration
    save_torch({"format": MODEL_FORMAT, "model_config": model.config(),
                "state_dict": model.state_dict(), "auc": {}, "label_names": list(labels),
                "positive_class": card["positive_class"], "image_size": size},
               folder / "model.pt")  # fmt: skip
    save_json(card, folder / "model_card.json")
    return folder


def write_study_dicom(
    path: Path, study: str, patient: str, seed: int, shape: tuple[int, int] = (20, 16)
) -> Path:
    """A 12-bit DX instance of ``study`` (patient, study and series attributes set)."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    rng = np.random.default_rng(seed)
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = DX
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = DX, meta.MediaStorageSOPInstanceUID
    ds.PatientID, ds.PatientName, ds.PatientBirthDate, ds.PatientSex = patient, "Test^P", "", "O"
    ds.StudyInstanceUID, ds.StudyID, ds.AccessionNumber = study, "1", f"A{seed}"
    ds.StudyDate, ds.StudyTime, ds.ReferringPhysicianName = "20240101", "120000", ""
    ds.SeriesInstanceUID, ds.SeriesNumber, ds.InstanceNumber = generate_uid(), 1, seed + 1
    ds.Modality = "DX"
    ds.Rows, ds.Columns = shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.PixelData = rng.integers(0, 4096, shape).astype(np.uint16).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)
    return path
