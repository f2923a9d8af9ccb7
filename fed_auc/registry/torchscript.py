"""TorchScript export (``model.ts``): the scoring module scripted, with the card and the
deployment facts inside the file (``torch.jit`` extra files), loadable by ``torch.jit.load``
alone — no fed-auc, no MONAI.

Scripted rather than traced: the input-shape check stays in the file, so an image of the
wrong size is refused instead of scored.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fed_auc.registry.deploy import DEPLOY_FILE, Source, check_images
from fed_auc.tta import predict

TORCHSCRIPT_FILE = "model.ts"
TORCHSCRIPT_TOLERANCE = 1e-5  # max |score difference| to fed-auc evaluate's scoring


def reference_scores(source: Source, images: torch.Tensor) -> np.ndarray:
    """What ``fed-auc evaluate`` scores for ``images`` (``fed_auc.tta.predict``, CPU fp32)."""
    return predict(source.model, images, source.tta)


def script(source: Source) -> torch.jit.ScriptModule:
    """The scripted scorer (torch.jit is deprecated in torch 2.x but still what a plain
    ``torch.jit.load`` runs; its deprecation warning is not the user's to act on)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.*deprecated", category=Warning)
        return torch.jit.script(source.scorer())


def write_torchscript(
    source: Source, out_dir: Path, facts: dict[str, Any], tolerance: float = TORCHSCRIPT_TOLERANCE
) -> tuple[Path, float]:
    """Write ``model.ts`` (extra files ``model_card.json`` and ``deploy.json``, which records
    the check) after checking the scripted module against ``fed-auc evaluate``'s scores;
    returns the path and the max absolute difference. Refuses (ValueError) a difference
    above ``tolerance``."""
    path = out_dir / TORCHSCRIPT_FILE
    module = script(source)
    images = check_images(source)
    with torch.no_grad():
        scores = module(images).numpy()
    diff = float(np.max(np.abs(scores - reference_scores(source, images))))
    if not diff <= tolerance:  # NaN too
        raise ValueError(
            f"TorchScript export: scores differ from fed-auc evaluate's by {diff:.3g} "
            f"(tolerance {tolerance:g}); {path} not written"
        )
    check = {"max_abs_diff": diff, "tolerance": tolerance, "images": len(images),
             "against": "fed-auc evaluate's scores (fed_auc.tta.predict, CPU fp32)"}  # fmt: skip
    facts = {**facts, "file": TORCHSCRIPT_FILE, "runtime": f"torch.jit (torch {torch.__version__})",
             "check": check}  # fmt: skip
    extra = {"model_card.json": json.dumps(source.card), DEPLOY_FILE: json.dumps(facts)}
    module.save(str(path), _extra_files=extra)
    return path, diff


def read_extra(path: str | Path) -> dict[str, Any]:
    """The card and deployment facts stored in a ``model.ts``."""
    extra = {"model_card.json": "", DEPLOY_FILE: ""}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.*deprecated", category=Warning)
        torch.jit.load(str(path), map_location="cpu", _extra_files=extra)
    return {name: json.loads(text) for name, text in extra.items()}
