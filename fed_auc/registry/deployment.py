"""``fed-auc export``: a registered model written as TorchScript, ONNX and a MONAI bundle, each
checked against ``fed-auc evaluate``'s scores and carrying the card's facts, plus one
``deploy.json`` that lists them.

Everything is written to a temporary folder beside ``out`` and moved in only when every
requested format passed its check, so a refused export leaves nothing half-written.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fed_auc.io import save_json
from fed_auc.registry.bundle import BUNDLE_DIR, write_bundle
from fed_auc.registry.deploy import DEPLOY_FILE, deploy_facts, read_source
from fed_auc.registry.onnx_format import ONNX_FILE, ONNX_TOLERANCE, require_onnx, write_onnx
from fed_auc.registry.torchscript import TORCHSCRIPT_FILE, TORCHSCRIPT_TOLERANCE, write_torchscript
from fed_auc.registry.weights import sha256

FORMATS = ("torchscript", "onnx", "bundle")
CARD_FILES = ("model_card.json", "MODEL_CARD.md")
WRITTEN = (TORCHSCRIPT_FILE, ONNX_FILE, BUNDLE_DIR, DEPLOY_FILE, *CARD_FILES)


def parse_formats(text: str) -> list[str]:
    """``torchscript,onnx,bundle`` (any subset, any order) → the formats in that order."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in FORMATS]
    if unknown or not names:
        raise ValueError(
            f"--format {text!r}: unknown format {', '.join(map(repr, unknown)) or '(none)'}; "
            f"valid: {', '.join(FORMATS)} (comma-separated)"
        )
    return [f for f in FORMATS if f in names]


def check_out(out: Path, force: bool) -> None:
    """Refuse an output path that is a file, or a non-empty folder unless ``force``."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        entries = sorted(p.name for p in out.iterdir())
        raise ValueError(
            f"--out {out}: folder is not empty ({', '.join(entries[:5])}"
            f"{' …' if len(entries) > 5 else ''}); choose an empty folder or pass --force "
            f"to replace the export's files there ({', '.join(WRITTEN)})"
        )


def export_deployment(
    model_dir: str | Path,
    out: str | Path,
    formats: list[str] = list(FORMATS),  # noqa: B006 - read only
    force: bool = False,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Write the requested formats of the registered model in ``model_dir`` to ``out``;
    returns the top-level ``deploy.json`` (facts plus, per format, its file, SHA-256 and
    check). Raises ValueError, naming what and where, for anything refused."""
    out = Path(out)
    check_out(out, force)
    if "onnx" in formats:
        require_onnx()
    source = read_source(model_dir)
    facts = deploy_facts(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    exports: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        work = Path(tmp)
        ts = None
        if "torchscript" in formats:
            ts, diff = write_torchscript(source, work, facts, TORCHSCRIPT_TOLERANCE)
            exports["torchscript"] = _entry(work, ts, diff, TORCHSCRIPT_TOLERANCE)
            say(f"TorchScript {out / ts.name}: max |score − fed-auc evaluate| = {diff:.2e}")
        if "onnx" in formats:
            path, diff = write_onnx(source, work, facts, ONNX_TOLERANCE)
            exports["onnx"] = _entry(work, path, diff, ONNX_TOLERANCE)
            say(f"ONNX {out / path.name}: max |onnxruntime − fed-auc evaluate| = {diff:.2e}")
        if "bundle" in formats:
            root = write_bundle(source, work, facts, ts)
            weights = root / "models" / "model.pt"
            exports["bundle"] = {"folder": BUNDLE_DIR, "file": str(weights.relative_to(work)),
                                 "sha256": sha256(weights)}  # fmt: skip
            say(f"MONAI bundle {out / BUNDLE_DIR}: configs/inference.json, models/model.pt")
        for name in CARD_FILES:
            if (source.file.parent / name).is_file():
                shutil.copy2(source.file.parent / name, work / name)
        summary = {**facts, "exports": exports}
        save_json(summary, work / DEPLOY_FILE)
        out.mkdir(parents=True, exist_ok=True)
        for name in WRITTEN:  # --force: the export's own entries are replaced, nothing else
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            if (work / name).exists():
                shutil.move(work / name, target)
    say(f"facts: {out / DEPLOY_FILE}")
    return json.loads((out / DEPLOY_FILE).read_text())


def _entry(root: Path, path: Path, diff: float, tolerance: float) -> dict[str, Any]:
    return {"file": str(path.relative_to(root)), "sha256": sha256(path),
            "max_abs_diff": diff, "tolerance": tolerance}  # fmt: skip
