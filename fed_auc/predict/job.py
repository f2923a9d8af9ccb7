"""One prediction job: load the registered model, score every item, write the CSV (and the
studies' SRs), record the job in the run store.

The CSV is the job's result; an image that cannot be read is a row with its reason, and the
job goes on. SRs come after the CSV, grouped by StudyInstanceUID: only DICOM inputs have a
study to belong to. The store gets one row of counts and paths (``fed_auc.store.predictions``):
the dashboard may read the store, so nothing per image or per patient goes there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fed_auc.data.images import DEFAULT_ASPECT
from fed_auc.node.compute import Compute
from fed_auc.predict.items import Inputs
from fed_auc.predict.output import POSITIVE, CsvWriter, ModelIdentity
from fed_auc.predict.report_sr import build_study_report, save_report
from fed_auc.predict.scoring import Scored, score_items
from fed_auc.registry.load import load_registered_model
from fed_auc.store.run_store import RunStore

NO_CALIBRATION = "this model's card has no calibration: the probability column is left empty"


@dataclass
class PredictionResult:
    """What the job did: counts, the failures by source and reason, the SRs, notes."""

    job_id: str
    model: ModelIdentity
    output: Path
    n_images: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    positives: list[int] = field(default_factory=list)
    reports: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def run_prediction(
    model_path: str | Path,
    inputs: Inputs,
    out: str | Path,
    runs_dir: str | Path,
    sr_dir: str | Path | None = None,
    compute: Compute | None = None,
    aspect: str = DEFAULT_ASPECT,
    batch: int | None = None,
    workers: int = 0,
    on_batch: Callable[[list[Scored]], None] | None = None,
) -> PredictionResult:
    """Score ``inputs`` with the model at ``model_path`` into the CSV ``out`` (and SRs into
    ``sr_dir``), recorded in the store of ``runs_dir``. A model that cannot be loaded is a
    ValueError before anything is written."""
    model, card = load_registered_model(model_path)
    identity = ModelIdentity.of(model_path, card)
    result = PredictionResult("", identity, Path(out), positives=[0] * len(identity.label_names))
    if identity.calibration is None:
        result.notes.append(NO_CALIBRATION)
    studies: dict[str, list[tuple[Any, dict[str, str]]]] = {}
    not_dicom = 0
    writer = CsvWriter(out, identity)
    try:
        for scored in score_items(model, card, inputs.items, compute, aspect, batch, workers,
                                  keep_headers=sr_dir is not None, on_batch=on_batch):  # fmt: skip
            cells = writer.write(scored)
            result.n_images += 1
            if scored.error is not None:
                result.failures.append((scored.source, scored.error))
                continue
            for j, label in enumerate(identity.label_names):
                result.positives[j] += cells[f"{label}_decision"] == POSITIVE
            if sr_dir is not None:
                study = scored.ids.get("StudyInstanceUID")
                if scored.header is None or not study:
                    not_dicom += 1
                else:
                    studies.setdefault(study, []).append((scored.header, cells))
    finally:
        writer.close()
    if sr_dir is not None:
        if not_dicom:
            result.notes.append(
                f"{not_dicom} scored image(s) are not DICOM (or have no StudyInstanceUID): a "
                "structured report belongs to a DICOM study, so they have none"
            )
        write_reports(studies, card, sr_dir, result)
    with RunStore(runs_dir) as store:
        result.job_id = store.record_prediction(record(result, inputs, sr_dir))
    return result


def write_reports(
    studies: dict[str, list[tuple[Any, dict[str, str]]]],
    card: dict[str, Any],
    sr_dir: str | Path,
    result: PredictionResult,
) -> None:
    """One SR per study; a study whose SR cannot be built is a note, the others are
    written."""
    for study, pairs in studies.items():
        try:
            sr = build_study_report([d for d, _ in pairs], [c for _, c in pairs], card)
            result.reports.append(save_report(sr, sr_dir))
        except Exception as exc:  # noqa: BLE001 - highdicom checks raise many types
            result.notes.append(f"study {study}: no structured report ({type(exc).__name__}: "
                                f"{exc})")  # fmt: skip


def record(result: PredictionResult, inputs: Inputs, sr_dir: str | Path | None) -> dict:
    """The store's row: counts and paths only."""
    model = result.model
    return {
        "model": model.path,
        "model_run_id": model.run_id,
        "model_sha256": model.sha256,
        "label_names": model.label_names,
        "positive_class": model.positive_class,
        "thresholds": model.thresholds,
        "input": inputs.description,
        "n_images": result.n_images,
        "n_failed": len(result.failures),
        "positives": result.positives,
        "output": str(result.output.resolve()),
        "sr_dir": None if sr_dir is None else str(Path(sr_dir).resolve()),
        "sr_count": len(result.reports),
        "calibrated": int(model.calibration is not None),
    }


def store_reports(site_file: str | Path, reports: list[Path]) -> str:
    """Store the written SRs on the PACS the site file names (STOW-RS); the line that says so."""
    import pydicom

    from fed_auc.data.dicomweb import Pacs, PacsSource
    from fed_auc.site import SiteDefinition

    site = SiteDefinition.from_toml(site_file)
    source = PacsSource.from_table(site.data["pacs"], str(site_file))
    Pacs(source).store([pydicom.dcmread(path) for path in reports])
    return f"stored {len(reports)} structured report(s) on the PACS at {source.url} (STOW-RS)"
