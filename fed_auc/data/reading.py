"""How a data file's images and labels are read: ``DataReading``.

The same seven choices (CheXpert's uncertain labels, frontal rows only, unreadable images
skipped, the positive label value, the aspect of non-square images, the positive class's
name, a multi-class column's classes) come from an experiment, a site file's ``[data]``
table or the command line and reach the loaders (``fed_auc.data.spec``, ``csv_images``,
``medmnist``) through several layers. One value travels instead of seven keywords, with the
loaders' defaults, so a new choice is added in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fed_auc.data.images import DEFAULT_ASPECT, validate_aspect
from fed_auc.data.labels import validate_positive_label

# What a CSV's -1 (uncertain) label cell becomes.
UNCERTAIN_POLICIES = {"zeros": 0.0, "ones": 1.0, "ignore": float("nan")}


@dataclass(frozen=True)
class DataReading:
    """``uncertain``: what -1 label cells become (zeros, ones or ignore = unknown);
    ``frontal_only``: only the rows whose Frontal/Lateral is Frontal; ``skip_bad_images``:
    skip unreadable image files with a warning instead of failing; ``positive_label``: the
    label value that is the positive class (None: the file's 1; fed_auc.data.labels);
    ``aspect``: how non-square images become square (pad, crop or stretch;
    fed_auc.data.images); ``positive_class``: the positive class's name (None: derived);
    ``classes``: a multi-class .npz column's number of classes (None: binary).

    ``uncertain``, ``aspect`` and ``positive_label`` are checked here, with the messages the
    loaders gave; ``classes`` and ``positive_class`` are checked where the source is known
    (an .npz or a CSV, its labels), by the loaders as before.
    """

    uncertain: str = "zeros"
    frontal_only: bool = False
    skip_bad_images: bool = False
    positive_label: int | None = None
    aspect: str = DEFAULT_ASPECT
    positive_class: str | list[str] | None = None
    classes: int | None = None

    def __post_init__(self) -> None:
        validate_aspect(self.aspect)
        object.__setattr__(self, "positive_label", validate_positive_label(self.positive_label))
        if self.uncertain not in UNCERTAIN_POLICIES:
            raise ValueError(
                f"uncertain policy must be one of {list(UNCERTAIN_POLICIES)}, got "
                f"{self.uncertain!r}"
            )

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> DataReading:
        """The reading a site file's ``[data]`` table gives (its keys as the fields; any other
        key is the table's own: spec, site, split_seed, ...)."""
        return cls(
            uncertain=table.get("uncertain", "zeros"),
            frontal_only=bool(table.get("frontal_only", False)),
            skip_bad_images=bool(table.get("skip_bad_images", False)),
            positive_label=table.get("positive_label"),
            aspect=table.get("aspect", DEFAULT_ASPECT),
            positive_class=table.get("positive_class"),
            classes=table.get("classes"),
        )
