"""The options that say which images the in-process sites hold and how they are read: a data
source split into sites, or the synthetic federation. Each describes a simulated federation:
over Flower every node owns its data (its site file's ``[data]`` table)."""

from __future__ import annotations

from dataclasses import dataclass

from fed_auc.data.images import ASPECTS, DEFAULT_ASPECT
from fed_auc.data.partition import parse_partition
from fed_auc.data.reading import UNCERTAIN_POLICIES, DataReading
from fed_auc.data.spec import parse_data_spec
from fed_auc.experiment.kinds import Interval, OneOf, Parsed
from fed_auc.experiment.option import option


@dataclass
class DataOptions:
    """The data source, its split into sites, and how its files are read and labelled."""

    data: str = option(
        "synthetic",
        help="synthetic, medmnist:PATH.npz or csv:PATH.csv[:IMAGE_ROOT]",
        group="data",
        check=Parsed(parse_data_spec, "synthetic, medmnist:PATH or csv:PATH[:ROOT]"),
        doc="`synthetic`, `medmnist:PATH` (MedMNIST `.npz`, binary or multi-label), "
        "`csv:PATH[:ROOT]` (image path column `Path`/`path`/`image`, label columns — the 5 "
        "CheXpert findings if present, else `label` —, optional `site`, patient id, `split`, "
        "`Frontal/Lateral`; PNG/JPEG via Pillow, `.dcm` via pydicom); the partition is saved "
        "as `<run>/partition.json`",
        simulated=True,
    )
    partition: str | None = option(
        None,
        help="natural (CSV site column), iid, dirichlet:ALPHA, quantity:ALPHA, imratio:R1,R2,...",
        group="data",
        check=Parsed(
            parse_partition, "natural, iid, dirichlet:ALPHA, quantity:ALPHA or imratio:R1,R2,..."
        ),
        doc="`natural` (site column), `iid`, `dirichlet:ALPHA` (label skew), `quantity:ALPHA` "
        "(size skew), `imratio:R1,...` (per-site training positive ratio)",
        default_doc="`natural` for CSV, else `iid`",
        simulated=True,
    )
    data_scale: float = option(
        1.0,
        help="the synthetic federation's split sizes multiplied by this (at least 2 images "
        "each), for quick runs",
        group="data",
        check=Interval(0, closed="(]"),
        simulated=True,
    )
    feature_shift: float = option(
        0.0,
        help="per-site scanner contrast/brightness shift strength",
        group="data",
        check=Interval(0),
        simulated=True,
    )
    uncertain: str = option(
        "zeros",
        help="what CheXpert's -1 (uncertain) labels become",
        group="data",
        check=OneOf(tuple(UNCERTAIN_POLICIES)),
        doc="CheXpert `-1` labels become `zeros`, `ones`, or `ignore` (unknown)",
        simulated=True,
    )
    frontal_only: bool = option(
        False,
        help="keep the rows whose Frontal/Lateral is Frontal",
        group="data",
        simulated=True,
    )
    skip_bad_images: bool = option(
        False,
        help="skip unreadable images with a warning (counted in the data card) instead of failing",
        group="data",
        simulated=True,
    )
    # Checked with the site files' same keys (fed_auc.data.labels), in ExperimentChecks.
    positive_label: int | None = option(
        None,
        help="label value of the file that is the positive class, every other value negative; "
        "e.g. 0 for BreastMNIST's malignant class",
        group="data",
        doc="the label value of the file that is the positive class, every other value "
        "negative (a multi-class MedMNIST column, declared with `--classes K`, becomes that "
        "class against the rest; without it any value but 0 or 1 is refused; a CSV takes 0 "
        "or 1); in the data cards. BreastMNIST codes malignant as **0** (1 = normal or "
        "benign), so `--positive-label 0` makes the AUC be about finding malignancy. Also "
        "`positive_label` in a site TOML's `[data]`",
        default_doc="the file's 1",
        simulated=True,
    )
    classes: int | None = option(
        None,
        help="a multi-class .npz label column's number of classes, with --positive-label (that "
        "class against the rest)",
        group="data",
        default_doc="binary: any value but 0 or 1 refused",
        simulated=True,
    )
    aspect: str = option(
        DEFAULT_ASPECT,
        help="how a non-square image file becomes square: pad (black borders), crop (centred "
        "square) or stretch",
        group="data",
        check=OneOf(ASPECTS),
        doc="how a non-square image file becomes square: `pad` (black borders, nothing lost), "
        "`crop` (centred square) or `stretch`; also `aspect` in a site TOML's `[data]`. How "
        'depth, DICOM windows, colour and alpha are read: hospitals/README.md, "How images '
        'are read"',
        simulated=True,
    )
    positive_class: str | None = option(
        None,
        help="the positive class's name in cards, evaluations and the dashboard, e.g. malignant",
        group="data",
        doc="the positive class's name (e.g. `malignant`), shown beside every AUC, sensitivity "
        "and ROC curve: data and model cards, `evaluation.json`/`.csv`, every dashboard page. "
        "Also `positive_class` in a site TOML's `[data]`",
        default_doc="derived: `label == V` (V the positive value), or a finding column's own name",
        simulated=True,
    )

    def data_reading(self) -> DataReading:
        """How the loaders read the data's images and labels (fed_auc.data.reading): the
        options of the same names."""
        return DataReading(
            uncertain=self.uncertain,
            frontal_only=self.frontal_only,
            skip_bad_images=self.skip_bad_images,
            positive_label=self.positive_label,
            aspect=self.aspect,
            positive_class=self.positive_class,
            classes=self.classes,
        )
