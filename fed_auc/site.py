"""One hospital, completely: its data, its splits and the settings of the node that serves it.

A site TOML is read by ``fed-auc simulate --site FILE`` (in-process) and by
``fed-auc node --site FILE`` (over Flower) with the same code: ``SiteDefinition.from_toml``,
then ``load`` for its images and ``fed_auc.node.build.build_node`` for its node. So the same
experiment on the same site files trains the same model either way.

```toml
name = "north"                  # the site's identifier in the store and the dashboard

[data]                          # image files (or a [synthetic] table instead)
spec = "csv:north.csv"          # medmnist:PATH.npz, csv:PATH[:IMAGE_ROOT] or dicomweb:LABELS.csv
                                # (images from the PACS [data.pacs] names:
                                # fed_auc.data.dicomweb); relative to this file
site = "north"                  # optional: only the rows of a shared CSV whose site column is this
uncertain = "zeros"             # CheXpert -1 labels: zeros, ones or ignore
frontal_only = false
skip_bad_images = false
split_seed = 0                  # seeds the patient-disjoint split when there is no split column
positive_label = 0              # optional: the file's label value that is positive (default 1)
classes = 2                     # optional: the label column's classes (default 2: only 0 or 1,
                                # also with positive_label); a multi-class .npz: their number
aspect = "pad"                  # non-square images: pad (default), crop or stretch
positive_class = "malignant"    # optional: its name in cards, evaluations and the dashboard
                                # (default: the label column's name, or "label == 0")
images_outside_root = false     # CSV image paths (after .. and symlinks) must stay under the
                                # image root (default); true: they may lead anywhere

[node]
state_dir = "nodes/north"       # local state per run; relative to this file
index = 0                       # optional (required for [synthetic]: it seeds the images)
local_steps = 8                 # optional: τ_i this site runs whatever the coordinator asks
threads = 2                     # optional: torch threads of the node (Flower only)
memory_budget = "6GiB"          # optional: bytes, a size, a fraction of a full step, or "auto"
augment = "flip"                # optional: this site's training augmentation
tta = "flip"                    # optional: this site's test-time augmentation
device = "auto"                 # optional: auto (CUDA when usable), cpu, cuda or cuda:N
precision = "fp32"              # optional: fp32, bf16 or fp16 (autocast; what travels is fp32)

[policy]                        # optional: what the node lets the federation ask
                                # (fed_auc.node.policy.rules lists every key)
```
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fed_auc.algorithms.partial import parse_budget
from fed_auc.data.augment import AUGMENTATIONS
from fed_auc.data.base import SiteData, check_name
from fed_auc.data.cache import CACHE_FOLDER
from fed_auc.data.images import validate_aspect
from fed_auc.data.labels import (
    validate_classes,
    validate_positive_class,
    validate_positive_label,
)
from fed_auc.data.reading import UNCERTAIN_POLICIES
from fed_auc.data.spec import SITE_KEYS, parse_data_spec
from fed_auc.data.synthetic import SiteProfile, federation_site
from fed_auc.node.compute import AUTO as AUTO_DEVICE
from fed_auc.node.compute import Compute, check_device, check_precision
from fed_auc.node.policy.rules import NodePolicy, parse_policy
from fed_auc.node.setup import SiteHosting
from fed_auc.tta import TTA_MODES

DATA_KEYS = SITE_KEYS  # a site file's [data] table is what site_from_config reads
NODE_KEYS = (
    "state_dir", "index", "local_steps", "threads", "memory_budget", "augment", "tta", "device",
    "precision",
)  # fmt: skip
AUTO = "auto"
NO_INDEX = 10**6  # sites without an index come after those with one, by name


@dataclass(frozen=True)
class SiteDefinition:
    """A parsed site TOML. ``profile`` (synthetic) or ``data`` (files) says where images come
    from; the rest configures the node. Paths are resolved against the file's folder."""

    path: Path
    name: str
    profile: SiteProfile | None = None
    data: dict[str, Any] = field(default_factory=dict)
    index: int | None = None
    state_dir: Path | None = None
    local_steps: int | None = None
    threads: int | None = None
    memory_budget: float | int | str | None = None
    augment: str | None = None
    tta: str | None = None
    device: str | None = None  # the operator's choice; None: the command's (auto by default)
    precision: str | None = None
    policy: NodePolicy = NodePolicy()

    @classmethod
    def from_toml(cls, path: str | Path) -> SiteDefinition:
        """Read and validate a site file; every error names the file, the field and the value."""
        path = Path(path)
        try:
            text = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValueError(f"{path}: cannot read site file: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: invalid TOML: {exc}") from None
        unknown = sorted(set(text) - {"name", "synthetic", "data", "node", "policy"})
        if unknown:
            raise ValueError(
                f"{path}: unknown top-level key(s) {unknown}; a site file has name, "
                "[synthetic] or [data], [node] and [policy]"
            )
        if ("synthetic" in text) == ("data" in text):
            raise ValueError(f"{path}: give exactly one of [synthetic] (generated) or [data]")
        node = text.get("node", {})
        if not isinstance(node, dict):
            raise ValueError(f"{path}: node must be a table ([node])")
        if "data" in node:  # the old shorthand, before file data (checked before unknown keys)
            raise ValueError(f"{path}: [node] data moved: use a [data] table with spec = ...")
        _check_keys(path, "node", node, NODE_KEYS)
        folder = path.parent
        profile, data = None, {}
        if "synthetic" in text:
            profile = SiteProfile.from_toml(path)
            name = profile.name
            if node.get("index") is None:
                raise ValueError(
                    f"{path}: [node] index is required for [synthetic] (it seeds the images)"
                )
        else:
            name = _name(path, text.get("name"))
            data = _data_table(path, text["data"], folder)
        for key in ("index", "local_steps", "threads"):
            low = 0 if key == "index" else 1
            value = node.get(key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < low
            ):
                raise ValueError(f"{path}: [node] {key} = {value!r}: must be an integer ≥ {low}")
        budget = node.get("memory_budget")
        if budget is not None and budget != AUTO:
            parse_budget(budget, f"{path}: [node] memory_budget")
        for key, choices in (("augment", AUGMENTATIONS), ("tta", TTA_MODES)):
            if node.get(key) is not None and node[key] not in choices:
                raise ValueError(
                    f"{path}: [node] {key} = {node[key]!r}: must be one of {list(choices)}"
                )
        if node.get("device") is not None:
            check_device(node["device"], f"{path}: [node] device")
        if node.get("precision") is not None:
            check_precision(node["precision"], f"{path}: [node] precision")
        state_dir = node.get("state_dir", f"nodes/{name}")
        if not isinstance(state_dir, str):
            raise ValueError(f"{path}: [node] state_dir = {state_dir!r}: must be a path string")
        state = (folder / state_dir).resolve()
        policy = NodePolicy(source=str(path), state_dir=state)
        if "policy" in text:
            policy = parse_policy(text["policy"], path, state)
        return cls(
            path=path,
            name=name,
            profile=profile,
            data=data,
            index=node.get("index"),
            state_dir=state,
            policy=policy,
            local_steps=node.get("local_steps"),
            threads=node.get("threads"),
            memory_budget=budget,
            augment=node.get("augment"),
            tta=node.get("tta"),
            device=node.get("device"),
            precision=node.get("precision"),
        )

    def compute(self, device: str = AUTO_DEVICE, precision: str = "fp32") -> Compute:
        """The node's device and precision: the file's, else ``device``/``precision`` (the
        command's); a device this machine lacks is an error naming the file."""
        return Compute.of(self.device or device, self.precision or precision, str(self.path))

    def with_compute(self, device: str | None, precision: str | None) -> SiteDefinition:
        """The site with the operator's command-line device and precision (given ones win
        over the file's)."""
        if device is not None:
            check_device(device, "--device")
        if precision is not None:
            check_precision(precision, "--precision")
        return dataclasses.replace(
            self, device=device or self.device, precision=precision or self.precision
        )

    @property
    def synthetic(self) -> bool:
        return self.profile is not None

    @property
    def order(self) -> tuple[int, str]:
        """Where the site stands in a federation (sampling order): by index, then by name."""
        return (NO_INDEX if self.index is None else self.index, self.name)

    @property
    def seed_index(self) -> int:
        """The site's share of the experiment seed (its batch sampler): its index, or a
        stable number from its name, so every way of running it draws the same batches."""
        return self.index if self.index is not None else zlib.crc32(self.name.encode()) % 100_000

    def load(
        self, image_size: int, num_labels: int = 1, seed: int = 0, data_scale: float = 1.0
    ) -> SiteData:
        """The site's train/val/test splits. Synthetic images depend on the experiment's seed
        (as in ``fed-auc simulate``); a file site's split on its own ``split_seed`` only, so its
        test images never change between experiments."""
        if self.profile is not None:
            site = federation_site(
                self.profile, self.index, image_size, num_labels, seed, data_scale
            )
            site.meta["site_file"] = str(self.path)
            return site
        from fed_auc.data.spec import site_from_config

        try:
            site = site_from_config(self.name, self.data, image_size, cache_dir=self.cache_dir)
        except ValueError as exc:
            raise ValueError(f"{self.path}: {exc}") from None
        site.meta["site_file"] = str(self.path)
        return site

    def hosting(self, device: str = AUTO_DEVICE, precision: str = "fp32") -> SiteHosting:
        """What this file decides for its node, the memory budget resolved now; its device
        and precision, else ``device``/``precision`` (the command's)."""
        return SiteHosting(
            name=self.name,
            seed_index=self.seed_index,
            order=self.order,
            synthetic=self.synthetic,
            memory_budget=self.budget(),
            augment=self.augment,
            tta=self.tta,
            local_steps=self.local_steps,
            compute=self.compute(device, precision),
            policy=self.policy,
        )

    @property
    def cache_dir(self) -> Path | None:
        """Where the site's images are cached (fed_auc.data.cache): its state directory."""
        return None if self.state_dir is None else self.state_dir / CACHE_FOLDER

    def budget(self) -> float | int | str | None:
        """The memory budget in bytes or as a fraction; ``auto``: the memory free right now."""
        if self.memory_budget == AUTO:
            return available_memory()
        return self.memory_budget


def load_site_files(paths: list[str | Path]) -> list[SiteDefinition]:
    """Several site files, in federation order; names must differ."""
    sites = sorted((SiteDefinition.from_toml(p) for p in paths), key=lambda s: s.order)
    seen: dict[str, Path] = {}
    for site in sites:
        if site.name in seen:
            raise ValueError(
                f"site name {site.name!r} is in both {seen[site.name]} and {site.path}"
            )
        seen[site.name] = site.path
    return sites


def site_files_in(folder: str | Path) -> list[Path]:
    """Every ``*.toml`` of a sites directory (``--sites-dir``)."""
    found = sorted(Path(folder).glob("*.toml"))
    if not found:
        raise ValueError(f"sites directory {folder}: no *.toml site file")
    return found


def available_memory() -> int:
    """Bytes the machine can give a new process now (MemAvailable on Linux)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _name(path: Path, name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{path}: missing required top-level field 'name' (a string)")
    return check_name(name, f"{path}: name")


def _check_keys(path: Path, table: str, values: dict[str, Any], valid: tuple[str, ...]) -> None:
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ValueError(f"{path}: unknown [{table}] key(s) {unknown}; valid: {list(valid)}")


def _data_table(path: Path, table: Any, folder: Path) -> dict[str, Any]:
    """The ``[data]`` table with its file paths made absolute (relative to the site file)."""
    if not isinstance(table, dict):
        raise ValueError(f"{path}: data must be a table ([data])")
    _check_keys(path, "data", table, DATA_KEYS)
    if not isinstance(table.get("spec"), str):
        raise ValueError(
            f"{path}: [data] needs spec = 'medmnist:PATH', 'csv:PATH[:ROOT]' or "
            "'dicomweb:LABELS.csv'"
        )
    try:
        spec = parse_data_spec(table["spec"])
    except ValueError as exc:
        raise ValueError(f"{path}: [data] {exc}") from None
    if spec.kind == "synthetic":
        raise ValueError(f"{path}: [data] spec = 'synthetic': use a [synthetic] table instead")
    for key in ("frontal_only", "skip_bad_images", "images_outside_root"):
        if not isinstance(table.get(key, False), bool):
            raise ValueError(f"{path}: [data] {key} = {table[key]!r}: must be true or false")
    if table.get("uncertain", "zeros") not in UNCERTAIN_POLICIES:
        raise ValueError(
            f"{path}: [data] uncertain = {table['uncertain']!r}: must be one of "
            f"{list(UNCERTAIN_POLICIES)}"
        )
    try:
        validate_aspect(table.get("aspect", "pad"), "[data] aspect")
        positive = validate_positive_label(table.get("positive_label"), "[data] positive_label")
        validate_classes(table.get("classes"), positive, "[data] classes")
        validate_positive_class(table.get("positive_class"), "[data] positive_class")
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    seed = table.get("split_seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"{path}: [data] split_seed = {seed!r}: must be an integer ≥ 0")
    if "site" in table and not isinstance(table["site"], str | int):
        raise ValueError(f"{path}: [data] site = {table['site']!r}: must be a string")
    if (spec.kind == "dicomweb") != ("pacs" in table):
        raise ValueError(
            f"{path}: [data.pacs] (the PACS's url, query, key, login) goes with "
            "spec = 'dicomweb:LABELS.csv', and only with it"
        )
    if spec.kind == "dicomweb":
        from fed_auc.data.dicomweb import PacsSource

        pacs = PacsSource.from_table(table["pacs"], str(path), folder.resolve())
        table = {**table, "pacs": pacs.as_table()}
    spec_path = (folder / spec.path).resolve()
    text = f"{spec.kind}:{spec_path}"
    if spec.root is not None:
        text += f":{(folder / spec.root).resolve()}"
    return {**table, "spec": text}


def check_site_data(site: SiteDefinition, data: SiteData) -> None:
    """A site a federation can use: every split has images; validation and test have both
    classes for every label (else its AUC is undefined there). Errors name the file."""
    for name in ("train", "val", "test"):
        split = getattr(data, name)
        if len(split) == 0:
            raise ValueError(f"{site.path}: site {site.name!r} has no {name} images")
        if name == "train":
            continue
        for label, positives, known in zip(
            data.label_names, split.positives(), split.known(), strict=True
        ):
            if positives == 0 or positives == known:
                one = "positive" if positives else "negative"
                raise ValueError(
                    f"{site.path}: the {name} split of site {site.name!r} has only {one} "
                    f"'{label}' labels ({positives} positive of {known}): its AUC is undefined; "
                    "give it images of both classes (a split column, or more rows)"
                )
