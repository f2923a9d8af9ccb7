"""Which label value of a file counts as positive (``--positive-label``).

The AUC losses and metrics read 1 as positive. Some files name the finding of interest 0:
MedMNIST's BreastMNIST has 0 = malignant, 1 = normal or benign, so without this option a
federation would learn to find benign images. ``positive_label`` says which value of the
file's (single) label column is the positive class; every other known value becomes
negative, so a multi-class MedMNIST column (``classes``: its number of classes) becomes
one-vs-rest. Unknown (NaN) stays unknown.
"""

from __future__ import annotations

import re
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


BINARY = 2  # a label column's classes unless a file says otherwise: 0 and 1


def validate_classes(value: object, positive_label: int | None, where: str = "classes") -> int:
    """``value``: how many classes a file's label column holds (values 0 … classes − 1); None
    means a binary column. A multi-class column needs ``positive_label`` (one against the
    rest): without the count, a stray value in a binary file would pass as one more class."""
    if value is None:
        return BINARY
    if isinstance(value, bool) or not isinstance(value, Integral) or value < BINARY:
        raise ValueError(
            f"{where} must be the number of classes of a multi-class label column, an integer "
            f"≥ 2 (e.g. 9 for PathMNIST), got {value!r}"
        )
    if value > BINARY and positive_label is None:
        raise ValueError(
            f"{where} = {value}: a multi-class column needs positive_label, the class that is "
            "positive against the rest"
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


# -- naming the positive class -------------------------------------------------------------
# Every AUC, sensitivity, ROC curve and operating point is "for" the positive class, so the
# cards, evaluation files and dashboard name it. A site file (``[data] positive_class``) or an
# experiment (``positive_class``) names it, e.g. "malignant"; without a name it is derived:
# a file's finding column is its own name (CheXpert's "Cardiomegaly"); a generic column
# ("label", "label0", …) reads "label == V", V the value that is positive (``positive_label``,
# else 1); with ``positive_label`` a finding column reads "Cardiomegaly == V".
GENERIC_LABEL = re.compile(r"label\d*")


def validate_positive_class(value: object, where: str = "positive_class") -> list[str] | None:
    """``value`` (a name, or one name per label) as a list of names; None when not given."""
    if value is None:
        return None
    names = [value] if isinstance(value, str) else value
    if (
        not isinstance(names, list)
        or not names
        or not all(isinstance(n, str) and n.strip() for n in names)
    ):
        raise ValueError(
            f"{where} must name the positive class (e.g. 'malignant'), or give one name per "
            f"label, got {value!r}"
        )
    return [n.strip() for n in names]


def positive_classes(
    label_names: list[str], positive_label: int | None = None, given: object = None
) -> list[str]:
    """One name per label for the class the numbers are about (see above)."""
    named = validate_positive_class(given)
    if named is not None:
        if len(named) != len(label_names):
            raise ValueError(
                f"positive_class {given!r} names {len(named)} class(es); the data has "
                f"{len(label_names)} label(s) {list(label_names)}"
            )
        return named
    value = 1 if positive_label is None else positive_label
    return [
        f"{name} == {value}"
        if GENERIC_LABEL.fullmatch(name) or positive_label is not None
        else name
        for name in label_names
    ]


def positive_class_text(names: list[str] | None) -> str:
    """``malignant``, or ``Cardiomegaly, Edema`` for several labels; "not recorded" if None."""
    if not names:
        return "not recorded (the files' label value 1)"
    return ", ".join(names)


def federation_positive_class(cards: list[dict]) -> list[str] | None:
    """The positive class of a federation from its sites' data cards, per label: the sites'
    common name, or every site's own name where they differ (``a (north) / b (south)``)."""
    per_site = [(c.get("site"), c.get("positive_class")) for c in cards if c.get("positive_class")]
    if not per_site:
        return None
    width = max(len(names) for _, names in per_site)
    out = []
    for j in range(width):
        seen: dict[str, list[str]] = {}
        for site, names in per_site:
            if j < len(names):
                seen.setdefault(names[j], []).append(str(site))
        out.append(
            next(iter(seen))
            if len(seen) == 1
            else " / ".join(f"{n} ({', '.join(s)})" for n, s in seen.items())
        )
    return out
