"""Split one MedMNIST-layout .npz into N hospital sites: one .npz and one site TOML per site.

Each site keeps the file's train/val/test splits: it gets a seeded share of every split, so no
image is in two sites and no image changes split. By default the share is stratified (each
site gets about 1/N of each class of each split, so every site's validation and test splits
have both classes); ``--dirichlet ALPHA`` skews the labels instead (each class spread over
the sites by Dirichlet(ALPHA) proportions, drawn once and used for all three splits, after
one image of each class per site and split where the split has enough). Multi-label files
are stratified on their first label.

Writes, in ``--out``:

- ``<name>.npz``: ``{train,val,test}_{images,labels}`` of that site (MedMNIST layout, rows
  in their original order, dtypes unchanged);
- ``<name>.toml``: the site file (``[data] spec = "medmnist:<name>.npz"``, ``[node]
  state_dir = "nodes/<name>"`` and ``index``), paths relative to the file, as
  ``fed-auc node --site`` and ``fed-auc simulate --site`` read it (hospitals/README.md);
- ``split.json``: the source, the options and each site's original row indices per split.

Example (hospitals/README.md, "Bring your own images")::

    python hospitals/examples/split_medmnist.py breastmnist.npz --out sites --sites 3

Standard library and numpy only, so a hospital can run it without fed-auc installed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

SPLITS = ("train", "val", "test")
DEFAULT_NAMES = ("north", "south", "east", "west", "central")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")  # as fed_auc.site accepts


def default_names(count: int) -> list[str]:
    """north, south, east, west, central, then site6, site7, ..."""
    return [DEFAULT_NAMES[i] if i < len(DEFAULT_NAMES) else f"site{i + 1}" for i in range(count)]


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The six MedMNIST arrays; errors name the file and what is missing or inconsistent."""
    try:
        archive = np.load(path)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: not a readable .npz file ({exc})") from None
    with archive:
        expected = [f"{s}_{kind}" for s in SPLITS for kind in ("images", "labels")]
        missing = [key for key in expected if key not in archive.files]
        if missing:
            raise SystemExit(f"{path}: missing key(s) {missing}; a MedMNIST .npz has {expected}")
        arrays = {key: archive[key] for key in expected}
    for s in SPLITS:
        images, labels = arrays[f"{s}_images"], arrays[f"{s}_labels"]
        if len(images) != len(labels):
            raise SystemExit(f"{path}: {s}_images has {len(images)} rows, {s}_labels {len(labels)}")
    return arrays


def first_label(labels: np.ndarray) -> np.ndarray:
    """The class a row is stratified on: its first label, as 0/1."""
    return (labels.reshape(len(labels), -1)[:, 0] > 0).astype(int)


def assign(
    classes: dict[str, np.ndarray], k: int, alpha: float | None, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Site index (0..k-1) of every row of every split."""
    props = None
    if alpha is not None:  # one draw per class, shared by the three splits
        props = {c: rng.dirichlet([alpha] * k) for c in (0, 1)}
    out = {}
    for split, cls in classes.items():
        site = np.empty(len(cls), dtype=int)
        if props is None:
            # Stratified: deal each class's shuffled rows round-robin, continuing the turn
            # from one class to the next, so site sizes and class counts differ by at most 1.
            order = np.concatenate([rng.permutation(np.flatnonzero(cls == c)) for c in (0, 1)])
            site[order] = np.arange(len(order)) % k
        else:
            for c in (0, 1):
                members = rng.permutation(np.flatnonzero(cls == c))
                reserved = k if len(members) >= k else 0  # one of this class per site first
                site[members[:reserved]] = np.arange(reserved)
                rest = members[reserved:]
                cuts = np.round(np.cumsum(props[c])[:-1] * len(rest)).astype(int)
                for index, chunk in enumerate(np.split(rest, cuts)):
                    site[chunk] = index
        out[split] = site
    return out


# Files whose label 1 is not the finding of interest: the positive class the walkthrough
# trains for unless --positive-label/--positive-class say otherwise. BreastMNIST: 0 =
# malignant, 1 = normal or benign (MedMNIST v2), so without this the federation would learn
# to find *benign* images and every sensitivity would be about them.
KNOWN_POSITIVE = {"breastmnist": (0, "malignant")}


def known_positive(path: Path) -> tuple[int | None, str | None]:
    """(positive_label, positive_class) for a file named like a known MedMNIST set."""
    stem = path.name.lower()
    for key, value in KNOWN_POSITIVE.items():
        if stem.startswith(key):
            return value
    return None, None


def site_toml(
    name: str,
    index: int,
    source: str,
    positive_label: int | None = None,
    positive_class: str | None = None,
) -> str:
    positive = ""
    if positive_label is not None:
        positive += (
            "# The file's label value that is the positive class (AUC, sensitivity, ROC).\n"
            f"positive_label = {positive_label}\n"
        )
    if positive_class is not None:
        positive += f'positive_class = "{positive_class}"\n'
    return (
        f"# Site {name!r}: rows of {source}, written by hospitals/examples/split_medmnist.py.\n"
        '# Field reference: hospitals/README.md ("Bring your own images").\n'
        f'name = "{name}"\n'
        "\n"
        "[data]\n"
        "# Relative to this file; the .npz keeps its own train/val/test splits.\n"
        f'spec = "medmnist:{name}.npz"\n'
        f"{positive}"
        "\n"
        "[node]\n"
        "# Local state per run and the SuperNode log (relative to this file).\n"
        f'state_dir = "nodes/{name}"\n'
        "# Position in the federation: seeds this site's batch sampling.\n"
        f"index = {index}\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Split a MedMNIST .npz into N site .npz files plus one site TOML each."
    )
    parser.add_argument("npz", type=Path, help="MedMNIST-layout .npz (e.g. breastmnist.npz)")
    parser.add_argument("--out", type=Path, default=Path("sites"), help="output folder (sites)")
    parser.add_argument("--sites", type=int, help="number of sites (default 3, or len(--names))")
    parser.add_argument(
        "--names", help="comma-separated site names (default north,south,east,west,central,...)"
    )
    parser.add_argument(
        "--dirichlet",
        type=float,
        metavar="ALPHA",
        help="label skew: each class spread by Dirichlet(ALPHA) proportions (default: stratified)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the split (0)")
    parser.add_argument(
        "--positive-label",
        type=int,
        help="the file's label value that is the positive class (default: 0 for BreastMNIST, "
        "whose 0 is malignant; else the file's 1)",
    )
    parser.add_argument(
        "--positive-class",
        help="its name in cards, evaluations and the dashboard (default: 'malignant' for "
        "BreastMNIST; else derived, e.g. 'label == 1')",
    )
    parser.add_argument("--force", action="store_true", help="overwrite existing files")
    args = parser.parse_args(argv)

    names = args.names.split(",") if args.names else None
    count = args.sites if args.sites is not None else (len(names) if names else 3)
    if names is None:
        names = default_names(count)
    if count < 1 or len(names) != count:
        parser.error(f"--sites {count} and --names {','.join(names)}: give one name per site")
    bad = [n for n in names if not NAME.match(n)]
    if bad or len(set(names)) != len(names):
        parser.error(
            f"--names {','.join(names)}: names must differ and use letters, digits, '_', '.' "
            "and '-', starting with a letter or digit"
        )
    if args.dirichlet is not None and not args.dirichlet > 0:
        parser.error(f"--dirichlet {args.dirichlet}: ALPHA must be > 0")

    known_label, known_class = known_positive(args.npz)
    positive_label = args.positive_label if args.positive_label is not None else known_label
    positive_class = args.positive_class
    if positive_class is None and args.positive_label in (None, known_label):
        positive_class = known_class
    if positive_label is not None and positive_label < 0:
        parser.error(f"--positive-label {positive_label}: a label value ≥ 0")

    arrays = read_npz(args.npz)
    targets = [args.out / f"{n}.{ext}" for n in names for ext in ("npz", "toml")]
    existing = [str(t) for t in targets if t.exists()]
    if existing and not args.force:
        raise SystemExit(f"{existing[0]} exists: use --force to overwrite, or another --out")

    rng = np.random.default_rng(args.seed)
    classes = {s: first_label(arrays[f"{s}_labels"]) for s in SPLITS}
    sites = assign(classes, count, args.dirichlet, rng)
    positives = {  # what the printout counts: the positive class's images
        s: classes[s]
        if positive_label is None
        else (arrays[f"{s}_labels"].reshape(len(classes[s]), -1)[:, 0] == positive_label).astype(
            int
        )
        for s in SPLITS
    }
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = {
        "source": str(args.npz),
        "seed": args.seed,
        "dirichlet": args.dirichlet,
        "positive_label": positive_label,
        "positive_class": positive_class,
        "sites": {},
    }
    print(f"{'site':<10} " + "  ".join(f"{s + ' n/pos':>14}" for s in SPLITS))
    warnings = []
    for index, name in enumerate(names):
        rows = {s: np.flatnonzero(sites[s] == index) for s in SPLITS}
        site_arrays = {}
        for s in SPLITS:
            site_arrays[f"{s}_images"] = arrays[f"{s}_images"][rows[s]]
            site_arrays[f"{s}_labels"] = arrays[f"{s}_labels"][rows[s]]
        np.savez_compressed(args.out / f"{name}.npz", **site_arrays)
        (args.out / f"{name}.toml").write_text(
            site_toml(name, index, args.npz.name, positive_label, positive_class)
        )
        manifest["sites"][name] = {s: rows[s].tolist() for s in SPLITS}
        cells = []
        for s in SPLITS:
            n, pos = len(rows[s]), int(positives[s][rows[s]].sum())
            cells.append(f"{f'{n}/{pos}':>14}")
            if s != "train" and (pos == 0 or pos == n):
                warnings.append(f"site {name}: its {s} split has one class ({pos} of {n})")
            if s == "train" and n == 0:
                warnings.append(f"site {name}: no training images")
        print(f"{name:<10} " + "  ".join(cells))
    (args.out / "split.json").write_text(json.dumps(manifest) + "\n")
    print(f"wrote {count} sites to {args.out}: <name>.npz, <name>.toml, split.json")
    if positive_label is not None or positive_class is not None:
        shown = positive_class or f"label == {positive_label}"
        value = 1 if positive_label is None else positive_label
        print(f"positive class: {shown} (label value {value} of the file; 'pos' counts it)")
    for warning in warnings:
        print(
            f"warning: {warning}: `fed-auc node --check` will refuse it (AUC undefined); "
            "use fewer sites, a larger --dirichlet ALPHA or another --seed",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
