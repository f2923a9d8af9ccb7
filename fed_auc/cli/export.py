"""``fed-auc export MODEL_DIR --out DIR``: a registered model as files a hospital deploys without
fed-auc — TorchScript, ONNX (checked with onnxruntime), a MONAI bundle — each carrying the
model card's facts (``fed_auc.registry.deployment``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_export_parser(sub: argparse._SubParsersAction) -> None:
    ex = sub.add_parser(
        "export", help="write a registered model as TorchScript, ONNX and a MONAI bundle"
    )
    ex.add_argument(
        "model",
        type=Path,
        metavar="MODEL_DIR",
        help="a registered model: <run>/model/ or models/<name>/ (model.pt + card)",
    )
    ex.add_argument("--out", required=True, type=Path, help="folder for the exported files")
    ex.add_argument(
        "--format",
        default="torchscript,onnx,bundle",
        help="comma-separated: torchscript, onnx, bundle (default: all three)",
    )
    ex.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty --out, replacing a previous export's files there",
    )


def export_command(args: argparse.Namespace) -> int:
    from fed_auc.registry.deployment import export_deployment, parse_formats

    try:
        export_deployment(args.model, args.out, parse_formats(args.format), args.force)
    except ValueError as exc:
        raise SystemExit(f"fed-auc export: {exc}") from None
    return 0
