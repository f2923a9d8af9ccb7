"""The data options shared by ``simulate``, ``data-card`` and ``evaluate``, and ``fed-auc
data-card``: read a data set, split it into sites, write one card per site."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from fed_auc.cli.option_flags import add_option_flags
from fed_auc.data.reading import DataReading
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.experiment.option import declared_options

# The options that say how a data source is read and split, shared by simulate, data-card and
# evaluate (declared once in fed_auc.experiment.data_options).
DATA_READING = (
    "data", "partition", "feature_shift", "positive_label", "classes", "positive_class",
    "uncertain", "frontal_only", "aspect", "skip_bad_images",
)  # fmt: skip


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """--data and the options that say how to read and split it (data-card, evaluate)."""
    add_option_flags(p, DATA_READING)


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


def data_option(args: argparse.Namespace, name: str) -> Any:
    """The data flag ``name``'s value, the option's default when not given."""
    value = getattr(args, name, None)
    return declared_options(ExperimentConfig)[name][0].default if value is None else value


def data_reading(args: argparse.Namespace) -> DataReading:
    """How ``load_sites``/``load_pool`` read the data (fed_auc.data.reading): the flags of
    the same names, unset ones at their defaults."""
    names = [f.name for f in dataclasses.fields(DataReading)]
    return DataReading(**{name: data_option(args, name) for name in names})


def num_sites(args: argparse.Namespace, default: int) -> int | None:
    """--sites, else `default`; None for the natural partition (the data's own sites)."""
    if args.sites is not None:
        return args.sites
    from fed_auc.data.spec import parse_data_spec

    partition = args.partition or parse_data_spec(args.data or "synthetic").default_partition
    return None if partition == "natural" else default


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
            feature_shift=data_option(args, "feature_shift"),
            reading=data_reading(args),
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
