"""MedMNIST-layout ``.npz`` files: ``{train,val,test}_images`` and ``{train,val,test}_labels``.

Binary tasks have labels (N, 1) in {0, 1}; multi-label tasks (N, L) in {0, 1}. Multi-class
files (one column with values > 1) need ``positive_label`` (that value against the rest):
an AUC per label needs binary labels. RGB images are averaged to one channel.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import torch

from fed_auc.data.images import resize
from fed_auc.data.labels import positive_note, select_positive, validate_positive_label
from fed_auc.data.pool import SPLITS, ImagePool

LICENSE = "CC BY 4.0 (MedMNIST v2; see the source dataset's own license)"


def load_medmnist(
    path: str | Path, image_size: int | None = None, positive_label: int | None = None
) -> ImagePool:
    """Read every split of a MedMNIST npz into one pool (split column = the file's splits).
    ``positive_label``: the label value that is positive (default: the file's 1)."""
    path = Path(path)
    positive_label = validate_positive_label(positive_label)
    if not path.is_file():
        raise ValueError(f"medmnist file {path} not found")
    try:
        archive = np.load(path)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: not a readable .npz file ({exc})") from None
    with archive:
        expected = [f"{s}_{kind}" for s in SPLITS for kind in ("images", "labels")]
        missing = [key for key in expected if key not in archive.files]
        if missing:
            raise ValueError(
                f"{path}: missing key(s) {missing}; found {sorted(archive.files)}; a "
                f"MedMNIST .npz has {expected}"
            )
        images, labels, split = [], [], []
        for s in SPLITS:
            x, y = archive[f"{s}_images"], archive[f"{s}_labels"]
            images.append(_images(path, s, x))
            labels.append(_labels(path, s, y, len(x), binary=positive_label is None))
            split += [s] * len(x)
    labels_all = select_positive(np.concatenate(labels), positive_label, str(path))
    meta = {"license": LICENSE, "file": str(path)}
    if positive_label is not None:
        meta["positive_label"] = positive_note(positive_label)
    names = (
        ["label"] if labels_all.shape[1] == 1 else [f"label{j}" for j in range(labels_all.shape[1])]
    )
    return ImagePool(
        images=resize(torch.cat(images), image_size),
        labels=torch.from_numpy(labels_all),
        label_names=names,
        source=f"medmnist:{path}",
        split=np.array(split),
        meta=meta,
    )


def _images(path: Path, split: str, x: np.ndarray) -> torch.Tensor:
    if x.ndim == 4 and x.shape[-1] in (1, 3):
        x = x.mean(axis=-1)
    if x.ndim != 3:
        raise ValueError(
            f"{path}: {split}_images has shape {x.shape}; expected (N, H, W) or (N, H, W, C)"
        )
    scale = 255.0 if x.dtype == np.uint8 or x.max() > 1 else 1.0
    return torch.from_numpy(x.astype(np.float32) / scale).unsqueeze(1)


def _labels(path: Path, split: str, y: np.ndarray, n: int, binary: bool = True) -> np.ndarray:
    y = y.reshape(len(y), -1) if y.ndim != 2 else y
    if len(y) != n:
        raise ValueError(f"{path}: {split}_labels has {len(y)} rows, {split}_images {n}")
    if not binary:  # positive_label picks one value; any integer class is allowed
        bad = np.argwhere(~np.isfinite(y) | (y != np.round(y)) | (y < 0))
        if len(bad):
            row, col = bad[0]
            raise ValueError(
                f"{path}: {split}_labels row {row} column {col} has value "
                f"{y[row, col].item()!r}; labels must be integer classes ≥ 0"
            )
        return y.astype(np.float32)
    bad = np.argwhere((y != 0) & (y != 1))
    if len(bad):
        row, col = bad[0]
        raise ValueError(
            f"{path}: {split}_labels row {row} column {col} has value {y[row, col].item()!r}; "
            "labels must be 0 or 1 (a multi-class task needs positive_label: one class "
            "against the rest)"
        )
    return y.astype(np.float32)
