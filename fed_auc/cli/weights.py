"""``fed-auc convert-weights``: a pickled model file made into tensors ``--init`` can read."""

from __future__ import annotations

import argparse


def add_convert_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert-weights",
        help="unpickle a trusted model file once and write its tensors only (for --init)",
        description="Runs the pickled code in IN: do it only where you trust the file and "
        "the package that defines its classes is installed (e.g. torchxrayvision). OUT "
        "ending in .safetensors is written with safetensors, anything else as a tensors-only "
        "torch file; neither ever runs code when read.",
    )
    p.add_argument("source", metavar="IN", help="the pickled model or checkpoint")
    p.add_argument("target", metavar="OUT", help="the tensors-only file to write (new)")


def convert_command(args: argparse.Namespace) -> int:
    from fed_auc.registry.weights import convert_weights

    try:
        print(convert_weights(args.source, args.target))
    except ValueError as exc:
        raise SystemExit(f"fed-auc {exc}") from None
    return 0
