"""Small data files the data tests write: MedMNIST npz, CheXpert-layout CSV + PNGs, DICOM."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from PIL import Image

FINDINGS = ["Cardiomegaly", "Edema", "Consolidation", "Atelectasis", "Pleural Effusion"]


def write_npz(
    path: Path, n: tuple[int, int, int] = (60, 20, 30), labels: int = 1, seed=0, signal=120
) -> Path:
    """A MedMNIST-layout npz whose positives have a brighter centre (by `signal` of 255)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, size in zip(("train", "val", "test"), n, strict=True):
        y = (rng.random((size, labels)) < 0.35).astype(np.uint8)
        y[0], y[1] = 1, 0  # both classes in every split
        x = rng.integers(0, 120, (size, 16, 16)).astype(np.float32)
        x[:, 5:11, 5:11] += signal * y[:, :1, None]
        arrays[f"{split}_images"] = x.astype(np.uint8)
        arrays[f"{split}_labels"] = y
    np.savez(path, **arrays)
    return path


def write_png(path: Path, value: float, seed: int, size: int = 16) -> None:
    rng = np.random.default_rng(seed)
    pixels = np.clip(rng.normal(value, 30, (size, size)), 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def write_chexpert(
    root: Path, sites: tuple[str, ...] = ("a", "b", "c"), per_site: int = 24, seed: int = 0
) -> Path:
    """CheXpert-layout CSV (Path, Sex, Age, Frontal/Lateral, AP/PA, 5 findings, site) + PNGs;
    two images per patient; cells are 1/0/-1/blank. Cardiomegaly brightens the image."""
    rng = np.random.default_rng(seed)
    rows = []
    for s, site in enumerate(sites):
        for i in range(per_site):
            patient = f"patient{s:02d}{i // 2:03d}"
            rel = f"train/{patient}/study1/view{i % 2 + 1}_frontal.png"
            cells = rng.choice(["1", "0", "0", "-1", ""], size=len(FINDINGS))
            cells[0] = "1" if i % 3 == 0 else "0"  # every site has both classes of the first
            write_png(root / rel, 150 if cells[0] == "1" else 90, seed=s * 1000 + i)
            rows.append(
                {
                    "Path": rel,
                    "Sex": "Female" if i % 2 else "Male",
                    "Age": str(40 + i),
                    "Frontal/Lateral": "Frontal" if i % 4 else "Lateral",
                    "AP/PA": "AP",
                    **dict(zip(FINDINGS, cells, strict=True)),
                    "site": site,
                }
            )
    path = root / "train.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_png16(path: Path, pixels: np.ndarray) -> None:
    """A 16-bit grayscale PNG (Pillow mode I;16), as hospital exports write them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.asarray(pixels, dtype=np.uint16)).save(path)


def write_dicom(
    path: Path,
    pixels: np.ndarray,
    photometric: str = "MONOCHROME2",
    slope: float | None = None,
    intercept: float | None = None,
    window: tuple[float, float] | None = None,
) -> None:
    """A minimal 16-bit grayscale DICOM file; optional rescale slope/intercept and VOI window
    (center, width)."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = meta.MediaStorageSOPClassUID
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.Rows, ds.Columns = pixels.shape
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = photometric
    ds.BitsAllocated = ds.BitsStored = 16
    ds.HighBit = 15
    ds.PixelRepresentation = 0
    ds.PixelData = pixels.astype(np.uint16).tobytes()
    if slope is not None or intercept is not None:
        ds.RescaleSlope = slope if slope is not None else 1
        ds.RescaleIntercept = intercept if intercept is not None else 0
    if window is not None:
        ds.WindowCenter, ds.WindowWidth = window
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)


def breast_site_files(tmp_path: Path) -> list[Path]:
    """A BreastMNIST-named npz (label 0 = malignant) split into three site files by the
    walkthrough's script (hospitals/examples/split_medmnist.py) with its defaults: the site
    files make malignancy the positive class."""
    import importlib.util

    script = Path(__file__).resolve().parents[2] / "hospitals" / "examples" / "split_medmnist.py"
    spec = importlib.util.spec_from_file_location("split_medmnist", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    source = write_npz(tmp_path / "breastmnist.npz", n=(60, 24, 30))
    assert module.main([str(source), "--out", str(tmp_path / "sites"), "--sites", "3"]) == 0
    return [tmp_path / "sites" / f"{name}.toml" for name in ("north", "south", "east")]
