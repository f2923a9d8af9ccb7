"""Which label value of a file counts as positive (``--positive-label``).

The AUC losses and metrics read 1 as positive. Some files name the finding of interest 0:
MedMNIST's BreastMNIST has 0 = malignant, 1 = normal or benign, so without this option a
federation would learn to find benign images. ``positive_label`` says which value of the
file's (single) label column is the positive class; every other known value becomes
negative, so a multi-class MedMNIST column becomes one-vs-rest. Unknown (NaN) stays unknown.
"""

from __future__ import annotations

from numbers import Integral

import numpy as np


def validate_positive_label(value: object, where: str = "positive_label") -> int | None:
    """``value`` as the label value to call positive (None: the file's own 1 = positive)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise ValueError(
            f"{where} must be a label value of the file, an integer ≥ 0 (e.g. 0 for "
            f"BreastMNIST's malignant class), got {value!r}"
        )
    return int(value)


def select_positive(
    labels: np.ndarray, positive_label: int | None, source: str, allowed: set[int] | None = None
) -> np.ndarray:
    """Labels (N, L) with ``positive_label`` → 1 and every other known value → 0.

    ``allowed``: the values the source can hold (a CSV's 0/1 after its uncertain policy);
    None: any integer. Errors name the source, the value and what the file holds.
    """
    if positive_label is None:
        return labels
    if labels.shape[1] != 1:
        raise ValueError(
            f"{source}: positive_label {positive_label} needs one label column, the file has "
            f"{labels.shape[1]}; a multi-label file keeps 1 = positive for every label"
        )
    known = labels[~np.isnan(labels)]
    values = sorted({int(v) for v in known})
    if allowed is not None and positive_label not in allowed:
        raise ValueError(
            f"{source}: positive_label {positive_label} is not a label this source can hold "
            f"({sorted(allowed)})"
        )
    if positive_label not in values:
        raise ValueError(
            f"{source}: positive_label {positive_label} does not occur in its labels; "
            f"values found: {values}"
        )
    out = np.where(np.isnan(labels), np.nan, (labels == positive_label).astype(np.float32))
    return out.astype(np.float32)


def positive_note(positive_label: int) -> str:
    """What the data card says about the relabelling."""
    return (
        f"label value {positive_label} of the file is the positive class; every other value "
        "is negative"
    )
