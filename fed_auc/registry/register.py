"""The model registry (`models/`): exported models copied under a name, format-checked."""

from __future__ import annotations

import shutil
from pathlib import Path

from fed_auc.data.base import check_name
from fed_auc.registry.load import load_registered_model

FILES = ("model.pt", "model_card.json", "MODEL_CARD.md")


def register_model(model_dir: str | Path, name: str, models_dir: str | Path = "models") -> Path:
    """Copy an exported model folder to ``models_dir/name``; never overwrites."""
    check_name(name, "model name")
    model_dir = Path(model_dir)
    load_registered_model(model_dir)  # refuses anything that is not the registry format
    target = Path(models_dir) / name
    if target.exists():
        raise ValueError(f"{target} already exists; choose another name")
    target.mkdir(parents=True)
    for file in FILES:
        if (model_dir / file).is_file():
            shutil.copy2(model_dir / file, target / file)
    return target
