"""``--data SPEC``: which source to read. ``synthetic`` (default), ``medmnist:PATH``,
``csv:PATH[:ROOT]`` (ROOT: where relative image paths start; default the CSV's folder)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fed_auc.data.pool import ImagePool

KINDS = ("synthetic", "medmnist", "csv")


@dataclass(frozen=True)
class DataSpec:
    kind: str
    path: Path | None = None
    root: Path | None = None

    @property
    def default_partition(self) -> str:
        """What `--partition` means when not given: the file's own sites, else iid."""
        return "natural" if self.kind == "csv" else "iid"


def parse_data_spec(text: str) -> DataSpec:
    """Parse a spec; errors say what forms are valid."""
    kind, _, rest = text.partition(":")
    if kind not in KINDS:
        raise ValueError(
            f"data spec {text!r}: unknown source {kind!r}; use synthetic, medmnist:PATH or "
            "csv:PATH[:ROOT]"
        )
    if kind == "synthetic":
        if rest:
            raise ValueError(f"data spec {text!r}: synthetic takes no path")
        return DataSpec(kind)
    if not rest:
        raise ValueError(f"data spec {text!r}: {kind} needs a path, e.g. {kind}:data/file")
    path, _, root = rest.partition(":") if kind == "csv" else (rest, "", "")
    return DataSpec(kind, Path(path), Path(root) if root else None)


def load_pool(
    spec: DataSpec,
    image_size: int,
    uncertain: str = "zeros",
    frontal_only: bool = False,
    skip_bad_images: bool = False,
) -> ImagePool:
    """Read a file source (not synthetic) into one pool of images resized to `image_size`."""
    if spec.kind == "medmnist":
        from fed_auc.data.medmnist import load_medmnist

        return load_medmnist(spec.path, image_size)
    if spec.kind == "csv":
        from fed_auc.data.csv_images import load_csv_images

        return load_csv_images(
            spec.path,
            spec.root,
            image_size=image_size,
            uncertain=uncertain,
            frontal_only=frontal_only,
            skip_bad_images=skip_bad_images,
        )
    raise ValueError(f"load_pool reads files; {spec.kind!r} is built by its own module")


def load_sites(
    data: str,
    partition: str | None,
    sites: int | None,
    seed: int,
    image_size: int,
    num_labels: int = 1,
    data_scale: float = 1.0,
    feature_shift: float = 0.0,
    uncertain: str = "zeros",
    frontal_only: bool = False,
    skip_bad_images: bool = False,
) -> tuple[list, dict | None]:
    """The sites of a run and the partition manifest (None for synthetic, whose sites are
    the fixed hospital profiles)."""
    spec = parse_data_spec(data)
    if spec.kind == "synthetic":
        from fed_auc.data.synthetic import make_synthetic_federation

        if partition is not None:
            raise ValueError("partition applies to file sources; synthetic sites are profiles")
        federation = make_synthetic_federation(
            num_sites=sites or 4,
            image_size=image_size,
            num_labels=num_labels,
            seed=seed,
            scale=data_scale,
        )
        return federation, None
    from fed_auc.data.partition import partition_pool

    pool = load_pool(spec, image_size, uncertain, frontal_only, skip_bad_images)
    return partition_pool(
        pool, partition or spec.default_partition, sites, seed, feature_shift=feature_shift
    )
