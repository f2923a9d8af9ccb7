"""A site's images from its PACS: ``spec = "dicomweb:LABELS.csv"`` with a ``[data.pacs]`` table.

The labels CSV names images by a DICOM UID (``[data.pacs] key``: SOPInstanceUID, or
StudyInstanceUID for one label per study) beside label columns as a CSV site has them
(``label``, or CheXpert's findings; optional ``split`` and ``patient_id``). The query
(QIDO-RS) lists the studies' instances; each labelled one is fetched once (WADO-RS) into the
node's state directory (``<cache>/pacs/<study>/<instance>.dcm``) and the rows become an
ordinary image CSV there, which ``fed_auc.data.csv_images`` decodes into the image cache as it
does any CSV. So training never re-reads the PACS, rows keep the labels file's order whatever
order the server answers in, and the same images as files give the same model.
"""

from __future__ import annotations

import csv
import json
import os
import warnings
from pathlib import Path

import pandas as pd

from fed_auc.data.cache import FILE_MODE, FOLDER_MODE
from fed_auc.data.csv_images import PATIENT_COLUMNS
from fed_auc.data.dicomweb import Pacs, PacsError, PacsSource

FOLDER = "pacs"  # under the site's image cache directory
IMAGES_CSV = "pacs_images.csv"  # the fetched rows, an image CSV the CSV reader takes as is
INSTANCES_FILE = "instances.json"  # the last answer of the query, used when the PACS is down


def fetch_site_images(
    source: PacsSource, labels_csv: Path, cache_dir: Path, skip_missing: bool = False
) -> Path:
    """Fetch the labelled images the query finds (those not fetched before) and write the
    image CSV of them; returns its path. A labelled image the PACS lacks is an error naming
    the labels file's line (``skip_missing``: a warning, the row left out)."""
    folder = private_folder(cache_dir / FOLDER)
    labels = _read_labels(labels_csv, source.key)
    pacs = Pacs(source)
    instances = _find(pacs, source, folder)
    by_key: dict[str, list[dict[str, str]]] = {}
    for instance in sorted(instances, key=lambda i: (i["SeriesInstanceUID"], i["SOPInstanceUID"])):
        if source.key not in instance:
            raise ValueError(
                f"[data.pacs] key = {source.key!r}: the query returns only {list(instance)}; "
                f"use one of {['SOPInstanceUID', 'StudyInstanceUID']}"
            )
        by_key.setdefault(instance[source.key], []).append(instance)
    patient_column = next((c for c in PATIENT_COLUMNS if c in labels.columns), None)
    extra = [c for c in labels.columns if c not in (source.key, "_line", patient_column)]
    rows, missing = [], []
    for _, row in labels.iterrows():
        found = by_key.get(row[source.key])
        if not found:
            missing.append(f"{labels_csv} line {row['_line']}: {source.key} {row[source.key]}")
            continue
        for instance in found:
            path = fetched_instance(pacs, instance, folder)
            patient = row[patient_column] if patient_column else instance["PatientID"]
            rows.append(
                {
                    "Path": str(path.relative_to(folder)),
                    **{c: row[c] for c in extra},
                    "patient_id": patient,
                    "StudyInstanceUID": instance["StudyInstanceUID"],
                    "SOPInstanceUID": instance["SOPInstanceUID"],
                }
            )
    if missing:
        where = f"the PACS at {source.url} (query {dict(source.query)})"
        if not skip_missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise PacsError(f"{missing[0]} is not on {where}{more}")
        warnings.warn(f"{len(missing)} labelled image(s) not on {where}, first: {missing[0]}",
                      stacklevel=2)  # fmt: skip
    unlabelled = len({i["SOPInstanceUID"] for i in instances}) - len(rows)
    if unlabelled > 0:
        warnings.warn(
            f"{unlabelled} image(s) the query finds on {source.url} have no row in {labels_csv}: "
            "not used",
            stacklevel=2,
        )
    if not rows:
        raise PacsError(f"no labelled image of {labels_csv} is on the PACS at {source.url}")
    return _write_rows(folder / IMAGES_CSV, rows)


def _read_labels(labels_csv: Path, key: str) -> pd.DataFrame:
    try:
        labels = pd.read_csv(labels_csv, dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ValueError(f"cannot read labels CSV {labels_csv}: {exc}") from None
    if key not in labels.columns:
        raise ValueError(
            f"{labels_csv}: no {key!r} column ([data.pacs] key names the column of DICOM UIDs); "
            f"found {list(labels.columns)}"
        )
    labels["_line"] = range(2, len(labels) + 2)
    labels[key] = labels[key].str.strip()
    return labels


def _find(pacs: Pacs, source: PacsSource, folder: Path) -> list[dict[str, str]]:
    """The query's instances; when the PACS cannot be reached, the last answer kept here (the
    images it names are fetched already), said in a warning."""
    kept = folder / INSTANCES_FILE
    try:
        instances = pacs.find_instances()
    except PacsError as exc:
        if not str(exc).startswith("cannot reach") or not kept.is_file():
            raise
        record = json.loads(kept.read_text())
        if record.get("url") != source.url or record.get("query") != dict(source.query):
            raise
        warnings.warn(f"{exc}; using the instances it listed before", stacklevel=3)
        return record["instances"]
    _write_atomically(
        kept,
        json.dumps({"url": source.url, "query": dict(source.query), "instances": instances})
        .encode(),
    )  # fmt: skip
    return instances


def fetched_instance(pacs: Pacs, instance: dict[str, str], folder: Path) -> Path:
    """The instance's file here, fetched from the PACS if it is not here yet."""
    study, sop = instance["StudyInstanceUID"], instance["SOPInstanceUID"]
    path = folder / _safe(study) / f"{_safe(sop)}.dcm"
    if not path.is_file():
        private_folder(path.parent)
        _write_atomically(path, pacs.fetch(study, instance["SeriesInstanceUID"], sop))
    return path


def _safe(uid: str) -> str:
    """A UID as a file name: a UID has only digits and dots; anything else is refused."""
    if not uid or not all(ch.isdigit() or ch == "." for ch in uid) or uid.strip(".") != uid:
        raise PacsError(f"the PACS answered a malformed UID {uid!r}")
    return uid


def private_folder(folder: Path) -> Path:
    """``folder`` (made if missing) readable by the node's user only, as the image cache."""
    folder.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
    os.chmod(folder, FOLDER_MODE)
    return folder


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (mode 0600) through a partial file: never half a file."""
    partial = path.with_name(path.name + ".partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(descriptor, "wb") as out:
        out.write(data)
    os.replace(partial, path)


def _write_rows(path: Path, rows: list[dict[str, str]]) -> Path:
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    os.replace(partial, path)
    return path
