"""``--data SPEC``: which source to read. ``synthetic`` (default), ``medmnist:PATH``,
``csv:PATH[:ROOT]`` (ROOT: where relative image paths start; default the CSV's folder); in a
site file also ``dicomweb:LABELS.csv`` (its images from the PACS ``[data.pacs]`` names:
fed_auc.data.pacs_source)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fed_auc.data.base import SiteData
from fed_auc.data.cache import ImageCache, file_sha256
from fed_auc.data.labels import BINARY, positive_classes
from fed_auc.data.pool import ImagePool
from fed_auc.data.reading import DataReading

KINDS = ("synthetic", "medmnist", "csv", "dicomweb")


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
            f"data spec {text!r}: unknown source {kind!r}; use synthetic, medmnist:PATH, "
            "csv:PATH[:ROOT] or (in a site file) dicomweb:LABELS.csv"
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
    reading: DataReading = DataReading(),
    site: str | None = None,
    cache: ImageCache | None = None,
    images_outside_root: bool = False,
) -> ImagePool:
    """Read a file source (not synthetic) into one pool of images resized to `image_size`,
    as ``reading`` says (fed_auc.data.reading): its `positive_label` is the label value that
    is the positive class (fed_auc.data.labels); its `aspect`: how non-square image files
    become square (fed_auc.data.images; MedMNIST images are square); its ``classes`` (npz
    only): a multi-class file's number of classes (None: binary); its ``positive_class`` is
    not read here (``load_sites`` names the class). `site` (CSV only): just the rows of that
    site. `cache`: decode the images into (or read them from) this on-disk cache, so the
    pool's images stay on disk (fed_auc.data.cache); None: in memory.
    ``images_outside_root`` (CSV only): accept image paths that lead outside the root
    (fed_auc.data.paths)."""
    classes = reading.classes
    if spec.kind == "medmnist":
        from fed_auc.data.medmnist import load_medmnist

        return load_medmnist(spec.path, image_size, reading.positive_label, cache, classes)
    if spec.kind == "dicomweb":
        raise ValueError(
            f"data spec dicomweb:{spec.path}: a PACS is named in a site file ([data.pacs]); "
            "give the site file (--site FILE)"
        )
    if classes not in (None, BINARY):
        raise ValueError(
            f"classes = {classes!r} applies to .npz files; {spec.path}'s labels are 1, 0, -1 or "
            "blank (drop classes)"
        )
    if spec.kind == "csv":
        from fed_auc.data.csv_images import load_csv_images

        return load_csv_images(
            spec.path,
            spec.root,
            image_size=image_size,
            reading=reading,
            site=site,
            cache=cache,
            images_outside_root=images_outside_root,
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
    reading: DataReading = DataReading(),
) -> tuple[list, dict | None]:
    """The sites of a run and the partition manifest (None for synthetic, whose sites are
    the fixed hospital profiles). ``reading``: how a file source's images and labels are
    read and its positive class named (fed_auc.data.reading); the synthetic federation
    reads none of it and refuses a ``positive_label``."""
    spec = parse_data_spec(data)
    if spec.kind == "synthetic" and reading.positive_label is not None:
        raise ValueError(
            f"positive_label {reading.positive_label!r} applies to file sources; the synthetic "
            "federation's positives are its findings"
        )
    if spec.kind == "synthetic":
        from fed_auc.data.synthetic import make_synthetic_federation

        federation = make_synthetic_federation(
            num_sites=sites or 4,
            image_size=image_size,
            num_labels=num_labels,
            seed=seed,
            scale=data_scale,
        )
        if partition is not None:
            from fed_auc.data.partition import impose_train_ratios

            federation = impose_train_ratios(federation, partition, seed)
        return federation, None
    from fed_auc.data.partition import partition_pool

    pool = load_pool(spec, image_size, reading)
    sites_out, manifest = partition_pool(
        pool, partition or spec.default_partition, sites, seed, feature_shift=feature_shift
    )
    named = positive_classes(pool.label_names, reading.positive_label, reading.positive_class)
    for site in sites_out:
        site.meta["positive_class"] = named
    return sites_out, manifest


SITE_KEYS = (
    "spec", "site", "uncertain", "frontal_only", "skip_bad_images", "split_seed", "positive_label",
    "aspect", "positive_class", "images_outside_root", "classes", "pacs",
)  # fmt: skip


def site_from_config(
    name: str,
    table: Mapping[str, Any],
    image_size: int,
    seed: int = 0,
    cache_dir: Path | None = None,
) -> SiteData:
    """A node's own data from the ``[data]`` table of its site TOML.

    ``spec`` is a file data spec; ``site`` (optional) keeps only the rows whose site column
    has that value; ``uncertain``, ``frontal_only``, ``skip_bad_images``,
    ``positive_label`` and ``classes`` as for ``--data``; ``aspect`` (pad, crop or stretch)
    for non-square images; ``images_outside_root`` (default false) lets CSV image paths lead
    outside the image root (fed_auc.data.paths). Without a split column the rows are split
    70/10/20 by patient, seeded by ``split_seed`` (default ``seed``). ``cache_dir``: the
    site's image cache (fed_auc.data.cache; a node's state directory holds it); None: images
    in memory.
    """
    unknown = sorted(set(table) - set(SITE_KEYS))
    if unknown or "spec" not in table:
        raise ValueError(
            f"site {name!r}: [data] needs 'spec' and takes only {list(SITE_KEYS)}; "
            f"unknown {unknown}"
        )
    spec = parse_data_spec(str(table["spec"]))
    if spec.kind == "synthetic":
        raise ValueError(f"site {name!r}: [data] spec must be a file source, got 'synthetic'")
    reading = DataReading.from_table(table)
    pool_spec = spec
    if spec.kind == "dicomweb":  # the PACS's images, fetched into the cache: an image CSV
        pool_spec = DataSpec("csv", _fetch_from_pacs(name, table, spec, cache_dir, reading))
    pool = load_pool(
        pool_spec,
        image_size,
        reading,
        site=str(table["site"]) if "site" in table and spec.kind == "csv" else None,
        cache=None if cache_dir is None else ImageCache(cache_dir, name),
        images_outside_root=bool(table.get("images_outside_root", False)),
    )
    if "site" in table:  # a CSV pool holds the site's rows already
        if pool.site is None:
            raise ValueError(f"site {name!r}: {spec.path} has no site column to select from")
        rows = np.flatnonzero(pool.site == str(table["site"]))
        if len(rows) == 0:
            raise ValueError(f"site {name!r}: no rows with site {table['site']!r} in {spec.path}")
        pool = pool.subset(rows)

    from fed_auc.data.partition import partition_pool

    split_seed = int(table.get("split_seed", seed))
    (site,), _ = partition_pool(pool, "iid", 1, split_seed)
    site.name = name
    # One hospital's own rows, not a partitioner's share: the card says where its splits
    # come from instead of "partition: iid".
    for key in ("partition", "seed", "feature_shift", "removed_for_imratio"):
        site.meta.pop(key, None)
    # what the site really holds: its spec and the content hash of its data file (the .npz, or
    # the CSV; not the images a CSV names), so runs on the same files are seen to be on them
    site.meta["data_spec"] = str(table["spec"]) + (
        f" (site {table['site']})" if "site" in table else ""
    )
    site.meta["data_sha256"] = file_sha256(spec.path)
    if spec.kind == "dicomweb":
        pacs = table["pacs"]
        site.meta["pacs"] = {"url": pacs["url"], "query": pacs.get("query", {})}
        site.meta["source"] = f"dicomweb:{pacs['url']}"  # not the CSV made of what it fetched
    site.meta["positive_class"] = positive_classes(
        site.label_names, reading.positive_label, reading.positive_class
    )
    site.meta["splits"] = (
        "the file's own splits"
        if pool.split is not None
        else f"seeded 70/10/20 by patient (split_seed {split_seed})"
    )
    return site


def _fetch_from_pacs(
    name: str, table: Mapping[str, Any], spec: DataSpec, cache_dir: Path | None, reading
) -> Path:
    """The image CSV of the site's labelled PACS images, fetched into ``cache_dir``."""
    from fed_auc.data.dicomweb import PacsSource
    from fed_auc.data.pacs_source import fetch_site_images

    if cache_dir is None:
        raise ValueError(f"site {name!r}: a PACS site fetches its images into its state directory")
    if "pacs" not in table:
        raise ValueError(f"site {name!r}: spec dicomweb:... needs a [data.pacs] table (url, ...)")
    source = PacsSource.from_table(table["pacs"], f"site {name!r}")
    return fetch_site_images(source, spec.path, cache_dir, reading.skip_bad_images)
