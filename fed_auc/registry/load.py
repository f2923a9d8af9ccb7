"""Load a registered model with its card."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from fed_auc.exchange import MODEL_FORMAT
from fed_auc.models import DenseNetClassifier, model_from_config


def load_registered_model(path: str | Path) -> tuple[DenseNetClassifier, dict[str, Any]]:
    """The network and card of a ``model.pt`` (or a folder holding one); anything that is not
    the registry format is refused with the reason."""
    path = Path(path)
    file = path / "model.pt" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"model {path}: no model.pt found (expected a {MODEL_FORMAT} file)")
    try:
        blob = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for foreign or corrupt files
        first = (str(exc).strip().splitlines() or [""])[0]  # one line: torch's run on
        raise ValueError(
            f"model {file}: not a {MODEL_FORMAT} file ({type(exc).__name__}: {first})"
        ) from None
    found = blob.get("format") if isinstance(blob, dict) else type(blob).__name__
    if found != MODEL_FORMAT:
        raise ValueError(
            f"model {file}: format {found!r}; fed-auc evaluate loads only {MODEL_FORMAT} "
            "(what `fed-auc simulate` exports to <run>/model/model.pt)"
        )
    model = model_from_config(blob["model_config"])
    model.load_state_dict(blob["state_dict"])
    card_file = file.parent / "model_card.json"
    card = json.loads(card_file.read_text()) if card_file.is_file() else {}
    card.setdefault("label_names", blob["label_names"])
    return model.eval(), card
