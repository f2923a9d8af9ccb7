"""What ``fed-auc predict`` scores: items, each a source to name, an image loader and (for
DICOM) a header carrying the instance's identifiers.

An item is not a path because not every input is a file: a DICOMweb query (added later)
yields instances fetched into memory. Whatever the input, scoring sees the same thing: call
``image(size, aspect)`` for the (1, size, size) image in [0, 1], ``header()`` for the DICOM
header without pixels (None for PNG/JPEG). Both are picklable (``functools.partial`` of
module functions), so a ``DataLoader`` worker can call them. Files are read by
``fed_auc.data.images.read_image``, the reader every site's data goes through: predict
preprocesses exactly as training and ``fed-auc evaluate`` did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from fed_auc.data.csv_images import IMAGE_COLUMNS
from fed_auc.data.images import BadImageError, read_image
from fed_auc.data.paths import contained_paths

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".dcm")  # what read_image reads (.dcm: DICOM)
DICOM_SUFFIX = ".dcm"
# The header attributes the CSV names an instance by (and the SR groups studies by).
IDENTIFIERS = ("PatientID", "AccessionNumber", "StudyInstanceUID", "SeriesInstanceUID",
               "SOPInstanceUID", "SOPClassUID")  # fmt: skip


def _no_header() -> None:
    return None


@dataclass(frozen=True)
class PredictItem:
    """One image to score. ``source``: what the user reads (a path, an instance's URL);
    ``image``: (size, aspect) → float32 (1, size, size) in [0, 1], raising on a bad image;
    ``header``: the DICOM header without pixels, or None when the image is not DICOM."""

    source: str
    image: Callable[[int | None, str], torch.Tensor]
    header: Callable[[], Any] = _no_header


@dataclass
class Inputs:
    """The items of one input, how the store describes it (never a patient identifier:
    a folder or CSV path), and lines to tell the user (files that are not images)."""

    items: list[PredictItem]
    description: str
    notes: list[str] = field(default_factory=list)


def dicom_header(path: Path) -> Any:
    """The header of a DICOM file (no pixel data); a BadImageError naming it if unreadable."""
    import pydicom

    try:
        return pydicom.dcmread(path, stop_before_pixels=True)
    except Exception as exc:  # noqa: BLE001 - pydicom raises many types for a corrupt file
        raise BadImageError(
            f"cannot read DICOM header of {path}: {type(exc).__name__}: {exc}"
        ) from None


def file_item(path: Path) -> PredictItem:
    """An image file: DICOM by its ``.dcm`` suffix (as ``read_image`` decides)."""
    is_dicom = path.suffix.lower() == DICOM_SUFFIX
    header = partial(dicom_header, path) if is_dicom else _no_header
    return PredictItem(str(path), partial(read_image, path), header)


def identifiers(header: Any) -> dict[str, str]:
    """The ``IDENTIFIERS`` a DICOM header has (empty for no header)."""
    if header is None:
        return {}
    return {name: str(header.get(name, "") or "") for name in IDENTIFIERS}


def folder_items(folder: str | Path) -> Inputs:
    """Every image under ``folder`` (recursively, sorted by path); a ValueError if the folder
    is missing or holds none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"--images {folder}: no such folder")
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    if not images:
        raise ValueError(
            f"--images {folder}: no image files ({', '.join(IMAGE_SUFFIXES)}) in it or below"
        )
    notes = []
    if len(files) > len(images):
        others = len(files) - len(images)
        notes.append(f"{others} file(s) under {folder} are not images by their suffix "
                     f"({', '.join(IMAGE_SUFFIXES)}) and are not scored")  # fmt: skip
    return Inputs([file_item(p) for p in images], f"folder {folder.resolve()}", notes)


def csv_items(csv_path: str | Path, images_outside_root: bool = False) -> Inputs:
    """The images a CSV names in its path column (``Path``, ``path`` or ``image``, as
    ``fed_auc.data.csv_images`` reads them), relative paths from the CSV's folder; a path
    leading outside that folder is refused unless ``images_outside_root``."""
    csv_path = Path(csv_path)
    try:
        table = pd.read_csv(csv_path, dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ValueError(f"--csv {csv_path}: cannot read it ({exc})") from None
    column = next((c for c in IMAGE_COLUMNS if c in table.columns), None)
    if column is None:
        raise ValueError(
            f"--csv {csv_path}: no image path column; expected one of {list(IMAGE_COLUMNS)}, "
            f"found {list(table.columns)}"
        )
    cells = [c.strip() for c in table[column]]
    if not cells:
        raise ValueError(f"--csv {csv_path}: no rows")
    lines = list(range(2, len(cells) + 2))  # the header is line 1
    paths = contained_paths(csv_path, csv_path.parent, cells, lines, images_outside_root)
    return Inputs([file_item(p) for p in paths], f"csv {csv_path.resolve()}")


def pacs_items(site_file: str | Path, query: dict[str, str] | None = None) -> Inputs:
    """Every instance of the studies a query finds on the PACS a site file names
    (``[data.pacs]``: url, login, CA; ``query`` replaces its query), fetched into the site's
    state directory (once: ``fed_auc.data.pacs_source``); patient data stay at the site."""
    import dataclasses

    from fed_auc.data.dicomweb import Pacs, PacsSource
    from fed_auc.data.pacs_source import FOLDER, fetched_instance, private_folder
    from fed_auc.site import SiteDefinition

    site = SiteDefinition.from_toml(site_file)
    if "pacs" not in site.data:
        raise ValueError(f"--pacs {site_file}: no [data.pacs] table (a PACS site file)")
    source = PacsSource.from_table(site.data["pacs"], str(site_file))
    if query is not None:
        source = dataclasses.replace(source, query=dict(query))
    pacs = Pacs(source)
    instances = sorted(
        pacs.find_instances(),
        key=lambda i: (i["StudyInstanceUID"], i["SeriesInstanceUID"], i["SOPInstanceUID"]),
    )
    if not instances:
        raise ValueError(f"the PACS at {source.url} has no instance for query {dict(source.query)}")
    folder = private_folder(site.cache_dir / FOLDER)
    items = [file_item(fetched_instance(pacs, i, folder)) for i in instances]
    # the query's keys, not its values: a query may name a patient, and the store is not
    # the place for patient identifiers
    keys = ", ".join(sorted(source.query)) or "none"
    return Inputs(items, f"PACS {source.url} (site {site.name}; query on {keys})")
