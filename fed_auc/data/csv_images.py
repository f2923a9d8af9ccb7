"""A CSV of image paths and labels (CheXpert layout works as is); PNG/JPEG and DICOM images.

Columns: an image path column (``Path``, ``path`` or ``image``), label columns (the five
CheXpert competition findings when present, else ``label``), optional ``site``, patient id
(``patient_id``/``PatientID``/``patient``, or the ``patientNNNNN`` part of a CheXpert path),
``split`` (train/val/test) and ``Frontal/Lateral``. Label cells: 1, 0, -1 (uncertain, mapped
by a policy) or blank (unknown, ignored by losses and metrics).

How each file becomes a [0, 1] grayscale square (bit depth, DICOM windows, colour, alpha,
aspect) and which images are flagged (constant, saturated): `fed_auc.data.images`.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from fed_auc.data.cache import CacheWriter, ImageCache, file_sha256, stat_digest
from fed_auc.data.images import FLAGS, BadImageError, read_image, read_image_facts
from fed_auc.data.labels import positive_note, select_positive
from fed_auc.data.memmap import CachedImages
from fed_auc.data.paths import contained_paths
from fed_auc.data.pool import SPLITS, ImagePool
from fed_auc.data.reading import UNCERTAIN_POLICIES, DataReading

CHEXPERT_FINDINGS = ["Cardiomegaly", "Edema", "Consolidation", "Atelectasis", "Pleural Effusion"]
IMAGE_COLUMNS = ("Path", "path", "image")
SITE_COLUMNS = ("site", "Site")
PATIENT_COLUMNS = ("patient_id", "PatientID", "patient")
_CHEXPERT_PATIENT = re.compile(r"(patient\d+)")
_VALUES = {"1": 1.0, "1.0": 1.0, "0": 0.0, "0.0": 0.0, "-1": -1.0, "-1.0": -1.0, "": None}


__all__ = ["BadImageError", "load_csv_images", "read_image"]


def load_csv_images(
    csv_path: str | Path,
    root: str | Path | None = None,
    image_size: int = 64,
    label_columns: list[str] | None = None,
    reading: DataReading = DataReading(),
    site: str | None = None,
    cache: ImageCache | None = None,
    images_outside_root: bool = False,
) -> ImagePool:
    """Read the CSV and every image it names (relative paths start at `root`, else the CSV's
    folder), resized to `image_size`. Errors name the CSV line, column and value. `reading`
    (`fed_auc.data.reading`): the uncertain policy, frontal rows only, unreadable images
    skipped; its `positive_label` 0: the label column's 0 is the positive class (after the
    uncertain policy), for files that code the finding of interest as 0; its `aspect`: how
    non-square images become square (pad, crop or stretch; `fed_auc.data.images`). `site`:
    only the rows whose site column has this value (other sites' images are never read).
    `cache`: decode into (or read from) this on-disk cache (`fed_auc.data.cache`) instead of
    memory. An image path that leads outside the root is refused unless
    `images_outside_root` (`fed_auc.data.paths`)."""
    csv_path = Path(csv_path)
    uncertain, frontal_only, aspect = reading.uncertain, reading.frontal_only, reading.aspect
    positive_label, skip_bad_images = reading.positive_label, reading.skip_bad_images
    try:
        table = pd.read_csv(csv_path, dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ValueError(f"cannot read CSV {csv_path}: {exc}") from None
    table["_line"] = np.arange(len(table)) + 2  # header is line 1
    image_column = _first(table, IMAGE_COLUMNS)
    if image_column is None:
        raise ValueError(
            f"{csv_path}: no image path column; expected one of {list(IMAGE_COLUMNS)}, "
            f"found {list(table.columns[:-1])}"
        )
    if label_columns is None:
        found = [c for c in CHEXPERT_FINDINGS if c in table.columns]
        label_columns = found or ["label"]
    missing = [c for c in label_columns if c not in table.columns]
    if missing:
        raise ValueError(
            f"{csv_path}: missing label column(s) {missing}; found {list(table.columns[:-1])}"
        )
    if site is not None:
        site_column = _first(table, SITE_COLUMNS)
        if site_column is None:
            raise ValueError(f"{csv_path}: no site column ({list(SITE_COLUMNS)}) to select from")
        table = table[table[site_column].str.strip() == str(site)]
        if len(table) == 0:
            raise ValueError(f"no rows with site {site!r} in {csv_path}")
    if frontal_only:
        if "Frontal/Lateral" not in table.columns:
            raise ValueError(f"{csv_path}: frontal_only needs a 'Frontal/Lateral' column")
        table = table[table["Frontal/Lateral"].str.strip().str.lower() == "frontal"]
    if len(table) == 0:
        raise ValueError(f"{csv_path}: no rows to read")
    labels = np.stack([_label_column(csv_path, table, c, uncertain) for c in label_columns], 1)
    labels = select_positive(labels, positive_label, str(csv_path), allowed={0, 1})
    root = Path(root) if root is not None else csv_path.parent
    paths = contained_paths(
        csv_path, root, table[image_column].tolist(), table["_line"].tolist(), images_outside_root
    )
    lines = list(zip(table["_line"].tolist(), table[image_column].tolist(), strict=True))
    found, writer = None, None
    if cache is not None:
        source = str(csv_path.resolve())
        key = cache.key(source, {
            "csv_sha256": file_sha256(csv_path), "images": stat_digest(paths),
            "root": str(root.resolve()), "image_size": image_size, "labels": list(label_columns),
            "uncertain": uncertain, "frontal_only": frontal_only, "site": site,
            "positive_label": positive_label, "aspect": aspect,
            "skip_bad_images": skip_bad_images,
        })  # fmt: skip
        found = cache.open(source, key)
        if found is None:
            writer = cache.writer(source, key, len(paths), image_size)
    if found is None:
        found = _read_images(csv_path, paths, lines, image_size, aspect, skip_bad_images, writer)
    images, read = found
    keep, skipped = np.asarray(read["keep"], dtype=np.int64), read["skipped"]
    files = [f"{lines[i][1]} (line {lines[i][0]})" for i in keep]
    if skipped:
        warnings.warn(
            f"{csv_path}: skipped {len(skipped)} unreadable image(s), first: {skipped[0]}",
            stacklevel=2,
        )
    if not len(keep):
        raise ValueError(f"{csv_path}: no readable image")
    table = table.iloc[keep]
    return ImagePool(
        images=images,
        labels=torch.from_numpy(labels[keep]),
        label_names=list(label_columns),
        source=f"csv:{csv_path}",
        split=_split_column(csv_path, table),
        site=_column(table, SITE_COLUMNS),
        patient=_patients(table, image_column),
        files=np.array(files),
        flags=_flags(read["flags"], len(keep)),
        meta={
            "file": str(csv_path),
            "aspect": aspect,
            "uncertain_policy": uncertain,
            "frontal_only": frontal_only,
            "skipped_images": len(skipped),
            "skipped_examples": skipped[:10],
            **({} if positive_label is None else {"positive_label": positive_note(positive_label)}),
        },
    )


def _read_images(
    csv_path: Path,
    paths: list[Path],
    lines: list[tuple[int, str]],
    image_size: int,
    aspect: str,
    skip_bad_images: bool,
    writer: CacheWriter | None,
) -> tuple[torch.Tensor | CachedImages, dict[str, Any]]:
    """Decode every image, into memory or into the cache ``writer`` builds, and what was
    read: the rows kept, the skipped ones, and each flag's rows (among those kept)."""
    images: list[torch.Tensor] = []
    read: dict[str, Any] = {"keep": [], "skipped": [], "flags": {name: [] for name in FLAGS}}
    try:
        for i, (path, (line, rel)) in enumerate(zip(paths, lines, strict=True)):
            try:
                image, found = read_image_facts(path, image_size, aspect)
            except BadImageError as exc:
                if not skip_bad_images:
                    raise BadImageError(f"{csv_path} line {line}: {exc}") from None
                read["skipped"].append(f"line {line}: {rel}")
                continue
            for flag in found.flags:
                read["flags"][flag].append(len(read["keep"]))
            read["keep"].append(i)
            if writer is None:
                images.append(image)
            else:
                writer.put(image)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    if writer is not None:
        return writer.commit(read)
    return (torch.stack(images) if images else torch.empty(0)), read


def _flags(rows: dict[str, list[int]], n: int) -> dict[str, np.ndarray]:
    """Each flag as a boolean per kept image, from the rows that have it."""
    out = {}
    for name in FLAGS:
        out[name] = np.zeros(n, dtype=bool)
        out[name][rows.get(name, [])] = True
    return out


def _label_column(csv_path: Path, table: pd.DataFrame, column: str, uncertain: str) -> np.ndarray:
    out = np.empty(len(table), dtype=np.float32)
    for i, (line, raw) in enumerate(zip(table["_line"], table[column], strict=True)):
        value = _VALUES.get(raw.strip(), "bad")
        if value == "bad":
            raise ValueError(
                f"{csv_path} line {line}, column {column!r}: label {raw!r} is not one of "
                "1, 0, -1 or blank"
            )
        if value is None:
            out[i] = np.nan
        elif value == -1.0:
            out[i] = UNCERTAIN_POLICIES[uncertain]
        else:
            out[i] = value
    return out


def _first(table: pd.DataFrame, names: tuple[str, ...]) -> str | None:
    return next((c for c in names if c in table.columns), None)


def _column(table: pd.DataFrame, names: tuple[str, ...]) -> np.ndarray | None:
    name = _first(table, names)
    return None if name is None else table[name].str.strip().to_numpy()


def _patients(table: pd.DataFrame, image_column: str) -> np.ndarray | None:
    column = _column(table, PATIENT_COLUMNS)
    if column is not None:
        return column
    found = table[image_column].str.extract(_CHEXPERT_PATIENT)[0]
    return None if found.isna().any() else found.to_numpy()


def _split_column(csv_path: Path, table: pd.DataFrame) -> np.ndarray | None:
    if "split" not in table.columns:
        return None
    split = table["split"].str.strip().str.lower().replace({"valid": "val", "validation": "val"})
    bad = ~split.isin(SPLITS)
    if bad.any():
        line = table["_line"][bad].iloc[0]
        raise ValueError(
            f"{csv_path} line {line}, column 'split': {table['split'][bad].iloc[0]!r} is not "
            f"one of {list(SPLITS)}"
        )
    return split.to_numpy()
