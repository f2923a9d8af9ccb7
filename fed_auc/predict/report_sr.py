"""One DICOM Structured Report per study: what the model said about each of its images, in a
form a PACS stores beside the images and a viewer shows with them (highdicom, TID 1500).

Per image and label, one measurement group (TID 1501) that references the image (source
image) and holds: the finding (the label's positive class), the score and, when the card has
a calibration, the calibrated probability as numeric measurements, the card's operating
threshold, and the decision as a qualitative evaluation (SNOMED CT Positive / Negative).
The algorithm (TID 4019: name ``fed-auc``, version the model's run id, its file's SHA-256 as
a parameter) is named in every group and the device observer (``fed-auc``, model name the
run id) in the observation context. Patient and study attributes come from the study's own
instances, so the SR belongs to the same study. Values are the CSV's text
(``fed_auc.predict.output``), so the two agree exactly.

Findings and measurement names have no standard code (a label is whatever a site named it):
they are coded in the private scheme ``99FEDAUC``, declared in the Coding Scheme
Identification Sequence. The image library (TID 1600) is left out: highdicom builds it only
for SOP classes whose modality it knows, and secondary captures are common exports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import highdicom as hd
from pydicom.dataset import Dataset
from pydicom.sr.codedict import codes
from pydicom.uid import generate_uid

from fed_auc.predict.output import POSITIVE

SCHEME = "99FEDAUC"
NAME = "fed-auc"
SERIES_NUMBER = 9900  # an SR series of its own beside the study's image series
SCORE = hd.sr.CodedConcept("SCORE", SCHEME, "fed-auc score")
PROBABILITY = hd.sr.CodedConcept("PROBABILITY", SCHEME, "calibrated probability")
THRESHOLD = hd.sr.CodedConcept("THRESHOLD", SCHEME, "operating threshold")
PROCEDURE = hd.sr.CodedConcept("363679005", "SCT", "Imaging procedure")
# Type 2 patient and study attributes the SR copies from its first instance: present in the
# SR even when empty, so an instance that lacks one lends an empty value.
PATIENT_STUDY = ("PatientName", "PatientID", "PatientBirthDate", "PatientSex", "StudyID",
                 "StudyDate", "StudyTime", "AccessionNumber", "ReferringPhysicianName")  # fmt: skip


def finding_code(j: int, positive_class: str) -> hd.sr.CodedConcept:
    """The finding of label ``j``: its positive class, in the private scheme."""
    return hd.sr.CodedConcept(f"FINDING{j}", SCHEME, positive_class[:64])


def _algorithm(run_id: str, sha256: str) -> hd.sr.AlgorithmIdentification:
    return hd.sr.AlgorithmIdentification(
        name=NAME, version=run_id[:64], parameters=[f"model.pt SHA-256 {sha256}"]
    )


def _observation_context(run_id: str, sha256: str) -> hd.sr.ObservationContext:
    device = hd.sr.DeviceObserverIdentifyingAttributes(
        uid=generate_uid(entropy_srcs=[NAME, sha256]),  # one device UID per model file
        name=NAME,
        model_name=run_id[:64],
    )
    observer = hd.sr.ObserverContext(
        observer_type=codes.DCM.Device, observer_identifying_attributes=device
    )
    return hd.sr.ObservationContext(observer_device_context=observer)


def _group(
    image: Dataset, cells: Mapping[str, str], label: str, j: int, algorithm: Any
) -> hd.sr.MeasurementsAndQualitativeEvaluations:
    """One image's findings for one label."""
    finding = finding_code(j, cells[f"{label}_positive_class"])
    numbers = [(SCORE, cells[f"{label}_score"]), (THRESHOLD, cells[f"{label}_threshold"])]
    if cells.get(f"{label}_probability"):
        numbers.insert(1, (PROBABILITY, cells[f"{label}_probability"]))
    measurements = [
        hd.sr.Measurement(
            name=name, value=float(text), unit=codes.UCUM.NoUnits, algorithm_id=algorithm
        )  # fmt: skip
        for name, text in numbers
    ]
    decision = codes.SCT.Positive if cells[f"{label}_decision"] == POSITIVE else codes.SCT.Negative
    return hd.sr.MeasurementsAndQualitativeEvaluations(
        tracking_identifier=hd.sr.TrackingIdentifier(
            uid=generate_uid(), identifier=f"{label} #{j}"[:64]
        ),
        finding_type=finding,
        algorithm_id=algorithm,
        measurements=measurements,
        qualitative_evaluations=[hd.sr.QualitativeEvaluation(finding, decision)],
        source_images=[
            hd.sr.SourceImageForMeasurementGroup(str(image.SOPClassUID), str(image.SOPInstanceUID))
        ],
    )


def build_study_report(
    datasets: Sequence[Dataset], rows: Sequence[Mapping[str, str]], card: Mapping[str, Any]
) -> Dataset:
    """The SR of one study: ``datasets`` are its scored instances (headers suffice) and
    ``rows`` their prediction rows (``fed_auc.predict.output.row``, same order, no errors);
    ``card`` names the labels. The caller stores it (a file, STOW-RS)."""
    if not datasets or len(datasets) != len(rows):
        raise ValueError(f"a study report needs its instances and as many rows, got "
                         f"{len(datasets)} and {len(rows)}")  # fmt: skip
    studies = {str(ds.StudyInstanceUID) for ds in datasets}
    if len(studies) != 1:
        raise ValueError(f"one report per study; these instances are of {sorted(studies)}")
    failed = [r["path"] for r in rows if r.get("error")]
    if failed:
        raise ValueError(f"an image without scores has no place in a report: {failed[0]}")
    run_id, sha256 = rows[0]["model_run_id"], rows[0]["model_sha256"]
    algorithm = _algorithm(run_id, sha256)
    groups = [
        _group(ds, cells, label, j, algorithm)
        for ds, cells in zip(datasets, rows, strict=True)
        for j, label in enumerate(card["label_names"])
    ]
    report = hd.sr.MeasurementReport(
        observation_context=_observation_context(run_id, sha256),
        procedure_reported=PROCEDURE,
        imaging_measurements=groups,
    )
    first = Dataset()
    first.update(datasets[0])  # a shallow copy: the caller's header is left as it was
    for name in PATIENT_STUDY:
        if name not in first:
            setattr(first, name, "")
    sr = hd.sr.Comprehensive3DSR(
        evidence=[first, *datasets[1:]],
        content=report,
        series_instance_uid=generate_uid(),
        series_number=SERIES_NUMBER,
        sop_instance_uid=generate_uid(),
        instance_number=1,
        manufacturer=NAME,
        series_description=f"{NAME} model {run_id}"[:64],
    )
    scheme = Dataset()
    scheme.CodingSchemeDesignator = SCHEME
    scheme.CodingSchemeName = "fed-auc findings and measurements"
    scheme.CodingSchemeResponsibleOrganization = NAME
    sr.CodingSchemeIdentificationSequence = [scheme]
    return sr


def save_report(sr: Dataset, out_dir: str | Path) -> Path:
    """Write ``sr`` as ``<StudyInstanceUID>.dcm`` in ``out_dir`` (a DICOM Part 10 file)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{sr.StudyInstanceUID}.dcm"
    sr.save_as(path, enforce_file_format=True)
    return path
