"""The data options shared by ``simulate``, ``data-card`` and ``evaluate``, and ``fed-auc
data-card``: read a data set, split it into sites, write one card per site."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """--data and the options that say how to read and split it (simulate, data-card, evaluate)."""
    p.add_argument(
        "--data", help="synthetic (default), medmnist:PATH.npz or csv:PATH.csv[:IMAGE_ROOT]"
    )
    p.add_argument(
        "--partition",
        help="natural (CSV site column; CSV default), iid (default), dirichlet:ALPHA, "
        "quantity:ALPHA, imratio:R1,R2,...",
    )
    p.add_argument("--feature-shift", type=float, help="per-site contrast/brightness shift (0)")
    p.add_argument(
        "--positive-label",
        type=int,
        help="label value of the file that is the positive class, every other value negative "
        "(default: 1); e.g. 0 for BreastMNIST's malignant class",
    )
    p.add_argument(
        "--classes",
        type=int,
        help="a multi-class .npz label column's number of classes, with --positive-label "
        "(that class against the rest); default: binary, any value but 0 or 1 refused",
    )
    p.add_argument(
        "--positive-class",
        help="the positive class's name in cards, evaluations and the dashboard, e.g. malignant "
        "(default: derived, 'label == V' or the finding column's name)",
    )
    p.add_argument("--uncertain", help="CheXpert -1 labels become: zeros (default), ones, ignore")
    p.add_argument("--frontal-only", action="store_true", default=None, help="frontal views only")
    p.add_argument(
        "--aspect",
        choices=("pad", "crop", "stretch"),
        help="non-square image files become square by: pad (default; black borders), crop "
        "(centred square) or stretch",
    )
    p.add_argument(
        "--skip-bad-images",
        action="store_true",
        default=None,
        help="skip unreadable images with a warning (count in the data card) instead of failing",
    )


def add_data_card_parser(sub: argparse._SubParsersAction) -> None:
    card = sub.add_parser("data-card", help="write a data card (Markdown + JSON) per site")
    add_data_arguments(card)
    card.add_argument("--sites", type=int, help="number of sites (default 4; natural: the data's)")
    card.add_argument("--image-size", type=int, default=28)
    card.add_argument("--seed", type=int, default=0)
    card.add_argument("--out", default="data_cards", help="output folder (data_cards)")
    card.add_argument(
        "--strict",
        action="store_true",
        help="exit non-zero when a card warns (constant or saturated images); cards are written",
    )


def data_options(args: argparse.Namespace) -> dict[str, Any]:
    """The data flags as ``load_sites``/``load_pool`` keywords, unset ones at their defaults."""
    return {
        "feature_shift": args.feature_shift or 0.0,
        "uncertain": args.uncertain or "zeros",
        "frontal_only": bool(args.frontal_only),
        "skip_bad_images": bool(args.skip_bad_images),
        "positive_label": args.positive_label,
        "classes": getattr(args, "classes", None),
        "aspect": args.aspect or "pad",
        "positive_class": getattr(args, "positive_class", None),
    }


def num_sites(args: argparse.Namespace, default: int) -> int | None:
    """--sites, else `default`; None for the natural partition (the data's own sites)."""
    if args.sites is not None:
        return args.sites
    natural = args.partition == "natural" or (
        args.partition is None and (args.data or "").startswith("csv:")
    )
    return None if natural else default


def write_data_cards(args: argparse.Namespace) -> int:
    from fed_auc.data.cards import card_warnings, write_cards
    from fed_auc.data.spec import load_sites

    try:
        sites, _ = load_sites(
            args.data or "synthetic",
            args.partition,
            num_sites(args, 4),
            args.seed,
            args.image_size,
            **data_options(args),
        )
    except ValueError as exc:
        raise SystemExit(f"fed-auc data-card: {exc}") from None
    for path in write_cards(sites, args.out):
        print(path)
    warned = [(site.name, line) for site in sites for line in card_warnings(site)]
    for name, line in warned:
        print(f"fed-auc data-card: warning: site {name}: {line}", file=sys.stderr)
    if warned and args.strict:
        raise SystemExit(
            f"fed-auc data-card --strict: {len(warned)} warning(s) in the cards written to "
            f"{args.out}: " + "; ".join(f"site {n}: {w}" for n, w in warned)
        )
    return 0
