"""Export a trained global model in the registry format: ``model.pt`` plus a model card.

``model.pt`` holds only tensors, strings and numbers (loadable with ``weights_only=True``):
the network weights, the AUC variables a, b, α, and the architecture config needed to
rebuild the network. The card says what the model was trained on, how, and how well it did
per site.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fed_auc.exchange import MODEL_FORMAT
from fed_auc.io import save_json, save_text, save_torch
from fed_auc.registry.card import render_model_card
from fed_auc.trainable import AUC, BUFFER, WEIGHT, Tensors


def export_model(
    out_dir: str | Path,
    tensors: Tensors,
    model_config: dict[str, Any],
    card: dict[str, Any],
) -> Path:
    """Write ``model.pt``, ``model_card.json`` and ``MODEL_CARD.md``; returns ``model.pt``."""
    out_dir = Path(out_dir)
    state_dict = {
        name[len(prefix) :]: t
        for name, t in tensors.items()
        for prefix in (WEIGHT, BUFFER)
        if name.startswith(prefix)
    }
    auc = {name[len(AUC) :]: t for name, t in tensors.items() if name.startswith(AUC)}
    path = out_dir / "model.pt"
    save_torch(
        {
            "format": MODEL_FORMAT,
            "model_config": model_config,
            "state_dict": state_dict,
            "auc": auc,
            "label_names": card["label_names"],
            # what --init checks, kept in the file too: a model.pt copied without its card
            "positive_class": card.get("positive_class"),
            "image_size": card.get("image_size"),
        },
        path,
    )
    save_json(card, out_dir / "model_card.json")
    save_text(render_model_card(card), out_dir / "MODEL_CARD.md")
    return path
