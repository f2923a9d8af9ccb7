"""MedMNIST-layout ``.npz`` files: ``{train,val,test}_images`` and ``{train,val,test}_labels``.

Binary tasks have labels (N, 1) in {0, 1}; multi-label tasks (N, L) in {0, 1}. Multi-class
files (one column with values > 1) need ``classes`` (their number) and ``positive_label``
(that value against the rest): an AUC per label needs binary labels. Any other value is
refused, also with ``positive_label``: a stray 2 in a binary file must not become a
negative. RGB images are averaged to one channel.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import IO

import numpy as np
import torch

from fed_auc.data.cache import ImageCache, file_sha256
from fed_auc.data.images import resize
from fed_auc.data.labels import (
    BINARY,
    positive_note,
    select_positive,
    validate_classes,
    validate_positive_label,
)
from fed_auc.data.memmap import CachedImages
from fed_auc.data.pool import SPLITS, ImagePool

CHUNK = 1024  # images read from the archive at a time while the cache is built
LICENSE = "CC BY 4.0 (MedMNIST v2; see the source dataset's own license)"


def load_medmnist(
    path: str | Path,
    image_size: int | None = None,
    positive_label: int | None = None,
    cache: ImageCache | None = None,
    classes: int | None = None,
) -> ImagePool:
    """Read every split of a MedMNIST npz into one pool (split column = the file's splits).
    ``positive_label``: the label value that is positive (default: the file's 1);
    ``classes``: a multi-class file's number of classes (default: binary). ``cache``:
    the images go to (or come from) this on-disk cache, read from the archive a chunk at a
    time (``fed_auc.data.cache``), instead of into memory."""
    path = Path(path)
    positive_label = validate_positive_label(positive_label)
    classes = validate_classes(classes, positive_label)
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
        if cache is None:
            images, labels, split = [], [], []
            for s in SPLITS:
                x, y = archive[f"{s}_images"], archive[f"{s}_labels"]
                images.append(_images(path, s, x))
                labels.append(_labels(path, s, y, len(x), classes, positive_label))
                split += [s] * len(x)
            pixels = resize(torch.cat(images), image_size)
        else:
            pixels, counts = _cached_images(path, image_size, cache)
            labels = [
                _labels(path, s, archive[f"{s}_labels"], n, classes, positive_label)
                for s, n in zip(SPLITS, counts, strict=True)
            ]
            split = [s for s, n in zip(SPLITS, counts, strict=True) for _ in range(n)]
    labels_all = select_positive(np.concatenate(labels), positive_label, str(path))
    meta = {"license": LICENSE, "file": str(path)}
    if positive_label is not None:
        meta["positive_label"] = positive_note(positive_label)
    names = (
        ["label"] if labels_all.shape[1] == 1 else [f"label{j}" for j in range(labels_all.shape[1])]
    )
    return ImagePool(
        images=pixels,
        labels=torch.from_numpy(labels_all),
        label_names=names,
        source=f"medmnist:{path}",
        split=np.array(split),
        meta=meta,
    )


def _cached_images(
    path: Path, image_size: int | None, cache: ImageCache
) -> tuple[CachedImages, list[int]]:
    """The file's images from ``cache``, built first if needed, and each split's count. The
    build reads each split's array from the archive ``CHUNK`` images at a time."""
    source = str(path.resolve())
    with zipfile.ZipFile(path) as archive:
        headers = []
        for s in SPLITS:
            with archive.open(f"{s}_images.npy") as f:
                headers.append(_header(f, path, s))
        counts = [shape[0] for shape, _ in headers]
        if image_size is None:
            image_size = headers[0][0][1]
        key = cache.key(source, {"npz_sha256": file_sha256(path), "image_size": image_size})
        found = cache.open(source, key)
        if found is not None:
            return found[0], counts
        writer = cache.writer(source, key, sum(counts), image_size)
        try:
            for s, (shape, dtype) in zip(SPLITS, headers, strict=True):
                row = int(np.prod(shape[1:])) * dtype.itemsize
                with archive.open(f"{s}_images.npy") as f:
                    _header(f, path, s)  # the rows follow the header
                    for start in range(0, shape[0], CHUNK):
                        n = min(CHUNK, shape[0] - start)
                        x = np.frombuffer(f.read(n * row), dtype).reshape(n, *shape[1:])
                        for image in resize(_images(path, s, x), image_size):
                            writer.put(image)
        except BaseException:
            writer.abort()
            raise
        return writer.commit({})[0], counts


def _header(f: IO[bytes], path: Path, split: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a ``.npy`` member, read from its header (``f`` is left at the
    first row)."""
    version = np.lib.format.read_magic(f)
    read = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    shape, fortran, dtype = read(f)
    if fortran or dtype.hasobject or len(shape) not in (3, 4):
        raise ValueError(
            f"{path}: {split}_images is not a C-ordered (N, H, W[, C]) array of numbers"
        )
    return shape, dtype


def _images(path: Path, split: str, x: np.ndarray) -> torch.Tensor:
    if x.ndim == 4 and x.shape[-1] in (1, 3):
        x = x.mean(axis=-1)
    if x.ndim != 3:
        raise ValueError(
            f"{path}: {split}_images has shape {x.shape}; expected (N, H, W) or (N, H, W, C)"
        )
    scale = 255.0 if x.dtype == np.uint8 or x.max() > 1 else 1.0
    return torch.from_numpy(x.astype(np.float32) / scale).unsqueeze(1)


def _labels(
    path: Path, split: str, y: np.ndarray, n: int, classes: int, positive_label: int | None
) -> np.ndarray:
    """A split's labels (N, L), every value one of the ``classes`` (0 … classes − 1)."""
    y = y.reshape(len(y), -1) if y.ndim != 2 else y
    if len(y) != n:
        raise ValueError(f"{path}: {split}_labels has {len(y)} rows, {split}_images {n}")
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(y) | (y != np.round(y)) | (y < 0) | (y >= classes)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        expected = "0 or 1" if classes == BINARY else f"0 … {classes - 1} (classes = {classes})"
        if classes > BINARY:
            remedy = "a file with more classes needs a larger classes"
        elif positive_label is None:
            remedy = (
                "a multi-class task needs positive_label (one class against the rest) and classes"
            )
        else:
            remedy = (
                f"positive_label {positive_label} picks one of them; a multi-class file needs "
                "classes = K ([data] classes, --classes K), else correct the file"
            )
        raise ValueError(
            f"{path}: {split}_labels row {row} column {col} has value {y[row, col].item()!r} "
            f"({int(bad.sum())} such row(s) in {split}); labels must be {expected}: {remedy}"
        )
    return y.astype(np.float32)
