"""The prediction CSV: one row per image, every number naming its model and positive class.

Per label: the score (the model's sigmoid, averaged over the card's TTA views), the calibrated
probability (the card's isotonic map; blank when the card has none), the decision at the
card's operating threshold and that threshold, and the class the score is about. Per row:
the model's run id and the SHA-256 of its ``model.pt`` (two files with the same run id but
other weights are told apart), and ``error`` when the image could not be read (no numbers
then). Scores and probabilities are written as DICOM decimal strings (``format_number_as_ds``,
within 1e-14 of the float32 score): the SR holds the same text, so the CSV and the SR agree
digit for digit, and the decision is that written score ≥ the threshold (the card's float,
written exactly), so the CSV agrees with itself.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fed_auc.data.cache import file_sha256
from fed_auc.evaluate.local import card_positive_class
from fed_auc.predict.items import IDENTIFIERS
from fed_auc.predict.scoring import Scored

POSITIVE, NEGATIVE = "positive", "negative"
PER_LABEL = ("score", "probability", "decision", "threshold", "positive_class")


@dataclass(frozen=True)
class ModelIdentity:
    """What every row and report says about the model: where it is, which run trained it,
    its file's hash, and per label the positive class, the threshold and the calibration."""

    path: str
    run_id: str
    sha256: str
    label_names: list[str]
    positive_class: list[str]
    thresholds: list[float]
    calibration: list[dict[str, Any]] | None

    @classmethod
    def of(cls, model_path: str | Path, card: dict[str, Any]) -> ModelIdentity:
        path = Path(model_path)
        file = path / "model.pt" if path.is_dir() else path
        names = list(card["label_names"])
        return cls(
            path=str(file.resolve()),
            run_id=str(card.get("run_id") or "unknown"),
            sha256=file_sha256(file),
            label_names=names,
            positive_class=[str(p) for p in card_positive_class(card)],
            thresholds=[float(t) for t in card.get("threshold") or [0.5] * len(names)],
            calibration=card.get("calibration") or None,
        )


def number_text(value: float) -> str:
    """A number as the SR stores it (a DICOM DS of at most 16 characters)."""
    from pydicom.valuerep import format_number_as_ds

    return format_number_as_ds(float(value))


def decide(score: float, threshold: float) -> str:
    """The decision at the operating point: positive when score ≥ threshold (as
    ``fed_auc.metrics.operating_point`` counts a positive call)."""
    return POSITIVE if score >= threshold else NEGATIVE


def probabilities(scores: np.ndarray, model: ModelIdentity) -> np.ndarray | None:
    """(L,) calibrated probabilities, or None when the card has no calibration."""
    if model.calibration is None:
        return None
    from fed_auc.metrics.calibration import apply_calibration

    return np.array([
        float(apply_calibration(np.asarray([scores[j]], dtype=np.float64), entry)[0])
        for j, entry in enumerate(model.calibration)
    ])  # fmt: skip


def columns(model: ModelIdentity) -> list[str]:
    per_label = [f"{label}_{what}" for label in model.label_names for what in PER_LABEL]
    return ["path", *IDENTIFIERS, *per_label, "model_run_id", "model_sha256", "error"]


def row(result: Scored, model: ModelIdentity) -> dict[str, str]:
    """One image's CSV row (all cells text)."""
    out = {"path": result.source, **dict.fromkeys(IDENTIFIERS, ""), **result.ids}
    probs = None if result.scores is None else probabilities(result.scores, model)
    for j, label in enumerate(model.label_names):
        threshold = model.thresholds[j]
        cells = dict.fromkeys(PER_LABEL, "")
        cells.update(threshold=repr(threshold), positive_class=model.positive_class[j])
        if result.scores is not None:
            score = number_text(result.scores[j])  # the decision is the written score's
            cells.update(score=score, decision=decide(float(score), threshold))
            if probs is not None:
                cells["probability"] = number_text(probs[j])
        out.update({f"{label}_{k}": v for k, v in cells.items()})
    out.update(model_run_id=model.run_id, model_sha256=model.sha256, error=result.error or "")
    return out


class CsvWriter:
    """Rows written as they come (a long job's finished rows are on disk), to a temporary
    file renamed onto ``path`` at the end: a reader never sees half a CSV."""

    def __init__(self, path: str | Path, model: ModelIdentity) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(self.path.name + ".partial")
        self._file = self._tmp.open("w", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=columns(model))
        self._writer.writeheader()
        self.model = model

    def write(self, result: Scored) -> dict[str, str]:
        cells = row(result, self.model)
        self._writer.writerow(cells)
        return cells

    def close(self) -> None:
        self._file.close()
        self._tmp.replace(self.path)
