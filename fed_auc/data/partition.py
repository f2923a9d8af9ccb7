"""Partitioners: split an `ImagePool` into sites the way real federations look.

``natural`` (the pool's site column), ``iid``, ``dirichlet:ALPHA`` (label skew: each class's
rows spread over sites by Dirichlet(ALPHA) proportions), ``quantity:ALPHA`` (size skew),
``imratio:R1,...,RK`` (site k's training positive ratio set to R_k by removing positives, or
negatives when it has too few: the CODASCA paper's imbalance benchmarks). Optional per-site
feature shift (scanner contrast and brightness). The unit of assignment is the patient when
the pool has patient ids, so no patient is in two sites or two splits. Every partition is
seeded and described by a JSON-able manifest (row indices per site and split) from which
`sites_from_manifest` rebuilds the sites exactly.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from fed_auc.data.base import SiteData, Split
from fed_auc.data.memmap import gather
from fed_auc.data.pool import SPLITS, ImagePool

MANIFEST_FORMAT = "fed-auc-partition/1"
KINDS = ("natural", "iid", "dirichlet", "quantity", "imratio")
MAX_TRIES = 200


def parse_partition(text: str) -> tuple[str, list[float]]:
    """``"dirichlet:0.5"`` -> ("dirichlet", [0.5]); errors name the bad text."""
    kind, _, args = text.partition(":")
    if kind not in KINDS:
        raise ValueError(
            f"partition {text!r}: unknown kind {kind!r}; use natural, iid, dirichlet:ALPHA, "
            "quantity:ALPHA or imratio:R1,R2,..."
        )
    try:
        values = [float(v) for v in args.split(",")] if args else []
    except ValueError:
        raise ValueError(
            f"partition {text!r}: {args!r} is not a comma-separated number list"
        ) from None
    needs = {"natural": 0, "iid": 0, "dirichlet": 1, "quantity": 1}
    if kind in needs and len(values) != needs[kind]:
        raise ValueError(f"partition {text!r}: {kind} takes {needs[kind]} number(s)")
    if kind in ("dirichlet", "quantity") and not values[0] > 0:
        raise ValueError(f"partition {text!r}: ALPHA must be > 0")
    if kind == "imratio" and (not values or not all(0 < r < 1 for r in values)):
        raise ValueError(f"partition {text!r}: imratio needs ratios in (0, 1), one per site")
    return kind, values


def partition_pool(
    pool: ImagePool,
    partition: str,
    num_sites: int | None,
    seed: int = 0,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    feature_shift: float = 0.0,
    min_train: int = 4,
) -> tuple[list[SiteData], dict[str, Any]]:
    """Sites and the manifest that reproduces them. `num_sites` None = as the data says."""
    kind, values = parse_partition(partition)
    rng = np.random.default_rng(seed)
    _, group_rows, group_split = _groups(pool)
    positive = (pool.labels == 1).any(dim=1).numpy()
    group_pos = np.array([positive[rows].any() for rows in group_rows])
    if kind == "natural":
        names, assignment = _natural(pool, group_rows, num_sites)
    else:
        if kind == "imratio" and num_sites is not None and len(values) != num_sites:
            raise ValueError(
                f"partition {partition!r}: {len(values)} ratio(s) for {num_sites} sites"
            )
        k = len(values) if kind == "imratio" else num_sites
        if k is None or k < 1:
            raise ValueError(f"partition {partition!r} needs a number of sites ≥ 1, got {k!r}")
        names = [f"site{i}" for i in range(k)]
        assignment = _draw(
            kind,
            values,
            k,
            group_split,
            group_pos,
            group_rows,
            rng,
            min_train,
            pool.split is None,
            val_fraction,
            test_fraction,
            partition,
        )
    sites: dict[str, dict[str, Any]] = {}
    for s, name in enumerate(names):
        mine = np.flatnonzero(assignment == s)
        splits = _site_splits(mine, group_split, rng, val_fraction, test_fraction)
        entry: dict[str, Any] = {
            split: sorted(int(r) for g in groups for r in group_rows[g])
            for split, groups in splits.items()
        }
        entry["patients"] = len(mine) if pool.patient is not None else None
        if not entry["train"]:
            raise ValueError(
                f"site {name!r} has no training images after partition {partition!r} "
                f"(seed {seed}); use fewer sites, a larger ALPHA, or check its rows"
            )
        if kind == "imratio":
            entry["train"], entry["removed"] = _impose_ratio(
                entry["train"], positive, values[s], rng
            )
            entry["imratio"] = values[s]
        if feature_shift > 0:
            entry["feature_shift"] = {
                "contrast": float(np.exp(feature_shift * rng.standard_normal())),
                "brightness": float(0.5 * feature_shift * rng.standard_normal()),
            }
        sites[name] = entry
    manifest = {
        "format": MANIFEST_FORMAT,
        "source": pool.source,
        "num_rows": len(pool),
        "partition": partition,
        "seed": seed,
        "val_fraction": val_fraction,
        "test_fraction": test_fraction,
        "feature_shift": feature_shift,
        "patient_disjoint": pool.patient is not None,
        "sites": sites,
    }
    return sites_from_manifest(pool, manifest), manifest


def impose_train_ratios(sites: list[SiteData], partition: str, seed: int) -> list[SiteData]:
    """``imratio:R1,...,RK`` on sites that are already split (the synthetic hospitals): site
    k's training positive ratio becomes R_k by removing positives (or negatives); validation
    and test splits are left as they are, as in the CODASCA paper's IH benchmarks."""
    kind, ratios = parse_partition(partition)
    if kind != "imratio":
        raise ValueError(
            f"partition {partition!r}: synthetic sites are profiles, already split; "
            "only imratio:R1,...,RK applies to them"
        )
    if len(ratios) != len(sites):
        raise ValueError(f"partition {partition!r}: {len(ratios)} ratio(s) for {len(sites)} sites")
    rng = np.random.default_rng(seed)
    out = []
    for site, ratio in zip(sites, ratios, strict=True):
        positive = (site.train.labels == 1).any(dim=1).numpy()
        kept, removed = _impose_ratio(list(range(len(site.train))), positive, ratio, rng)
        index = torch.tensor(kept, dtype=torch.long)
        train = Split(site.train.images[index], site.train.labels[index])
        meta = {**site.meta, "imratio": ratio, "removed_train_rows": len(removed)}
        out.append(replace(site, train=train, meta=meta))
    return out


def sites_from_manifest(pool: ImagePool, manifest: dict[str, Any]) -> list[SiteData]:
    """Rebuild the sites of a manifest from the same pool (same rows in the same order)."""
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("num_rows") != len(pool):
        raise ValueError(
            f"partition manifest (format {manifest.get('format')!r}, {manifest.get('num_rows')} "
            f"rows) does not fit {pool.source} ({len(pool)} rows, format {MANIFEST_FORMAT})"
        )
    out = []
    for name, entry in manifest["sites"].items():
        shift = entry.get("feature_shift")
        splits = {}
        for split in SPLITS:
            rows = torch.tensor(entry[split], dtype=torch.long)
            images = pool.images[rows]
            if shift:
                images = (
                    (gather(images) - 0.5) * shift["contrast"] + 0.5 + shift["brightness"]
                ).clamp(0, 1)
            splits[split] = Split(images, pool.labels[rows])
        meta = {
            "source": pool.source,
            "partition": manifest["partition"],
            "seed": manifest["seed"],
            "patients": entry.get("patients"),
            "feature_shift": shift,
            "removed_for_imratio": len(entry.get("removed", [])),
            **({"imratio": entry["imratio"]} if "imratio" in entry else {}),
            **{k: v for k, v in pool.meta.items() if k != "file"},
        }
        report = pool.image_report(np.concatenate([np.asarray(entry[s], int) for s in SPLITS]))
        if report is not None:  # image files: how they were read, and the suspect ones
            meta["images"] = report
        out.append(SiteData(name, label_names=list(pool.label_names), meta=meta, **splits))
    return out


def _groups(pool: ImagePool) -> tuple[list[Any], list[np.ndarray], np.ndarray]:
    """Rows grouped by (split, patient); a row is its own group without patient ids."""
    split = pool.split if pool.split is not None else np.array([""] * len(pool))
    patient = pool.patient if pool.patient is not None else np.arange(len(pool)).astype(str)
    keys: dict[tuple[str, str], list[int]] = {}
    for row, key in enumerate(zip(split, patient, strict=True)):
        keys.setdefault(key, []).append(row)
    rows = [np.array(r) for r in keys.values()]
    return list(keys), rows, np.array([k[0] for k in keys])


def _natural(
    pool: ImagePool, group_rows: list[np.ndarray], num_sites: int | None
) -> tuple[list[str], np.ndarray]:
    if pool.site is None:
        raise ValueError(f"{pool.source}: partition 'natural' needs a 'site' column")
    group_site = np.array([pool.site[rows[0]] for rows in group_rows])
    names = list(dict.fromkeys(pool.site.tolist()))
    if "" in names:
        row = int(np.flatnonzero(pool.site == "")[0])
        raise ValueError(f"{pool.source}: row {row} has a blank site")
    if num_sites is not None and num_sites != len(names):
        raise ValueError(
            f"{pool.source} has {len(names)} sites {names}, but {num_sites} were asked for "
            f"(use --sites {len(names)} with the natural partition)"
        )
    return names, np.array([names.index(s) for s in group_site])


def _draw(
    kind,
    values,
    k,
    group_split,
    group_pos,
    group_rows,
    rng,
    min_train,
    resplit,
    val_fraction,
    test_fraction,
    text,
) -> np.ndarray:
    """Seeded group -> site assignment; redrawn until every site has `min_train` train rows."""
    sizes = np.array([len(r) for r in group_rows])
    for _ in range(MAX_TRIES):
        if kind == "dirichlet":
            props = {c: rng.dirichlet([values[0]] * k) for c in (False, True)}
        elif kind == "quantity":
            props = dict.fromkeys((False, True), rng.dirichlet([values[0]] * k))
        else:  # iid, imratio
            props = dict.fromkeys((False, True), np.full(k, 1.0 / k))
        assignment = np.empty(len(group_rows), dtype=int)
        for part in np.unique(group_split):
            for cls in (False, True):
                members = np.flatnonzero((group_split == part) & (group_pos == cls))
                members = rng.permutation(members)
                cuts = np.round(np.cumsum(props[cls])[:-1] * len(members)).astype(int)
                for site, chunk in enumerate(np.split(members, cuts)):
                    assignment[chunk] = site
        train = (group_split == "train") if not resplit else np.ones(len(sizes), bool)
        share = 1.0 - (val_fraction + test_fraction if resplit else 0.0)
        per_site = np.bincount(assignment[train], weights=sizes[train], minlength=k) * share
        if per_site.min() >= min_train:
            return assignment
    raise ValueError(
        f"partition {text!r}: could not give every one of {k} sites at least {min_train} "
        f"training images in {MAX_TRIES} draws; use fewer sites or a larger ALPHA"
    )


def _site_splits(
    mine: np.ndarray,
    group_split: np.ndarray,
    rng: np.random.Generator,
    val_fraction: float,
    test_fraction: float,
) -> dict[str, np.ndarray]:
    """The site's groups per split: the source's split column, or a seeded random split."""
    if (group_split[mine] != "").all():
        return {s: mine[group_split[mine] == s] for s in SPLITS}
    order = rng.permutation(mine)
    n_test = int(round(test_fraction * len(order)))
    n_val = int(round(val_fraction * len(order)))
    return {
        "test": order[:n_test],
        "val": order[n_test : n_test + n_val],
        "train": order[n_test + n_val :],
    }


def _impose_ratio(
    train: list[int], positive: np.ndarray, ratio: float, rng: np.random.Generator
) -> tuple[list[int], list[int]]:
    """Drop positives (or negatives) at random until positives / all = ratio."""
    rows = np.array(train)
    pos, neg = rows[positive[rows]], rows[~positive[rows]]
    keep_pos = int(np.floor(ratio * len(neg) / (1 - ratio)))
    if keep_pos <= len(pos):
        kept_pos, kept_neg = rng.permutation(pos)[: max(keep_pos, 1)], neg
    else:
        keep_neg = int(np.floor(len(pos) * (1 - ratio) / ratio))
        kept_pos, kept_neg = pos, rng.permutation(neg)[:keep_neg]
    kept = np.sort(np.concatenate([kept_pos, kept_neg])).tolist()
    removed = sorted(set(train) - set(kept))
    return [int(r) for r in kept], [int(r) for r in removed]


PARTITION_FILE = "partition.json"
