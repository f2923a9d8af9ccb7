"""The model registry (`models/`): exported models copied under a name, format-checked."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from fed_auc.registry.load import load_registered_model

FILES = ("model.pt", "model_card.json", "MODEL_CARD.md")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def register_model(model_dir: str | Path, name: str, models_dir: str | Path = "models") -> Path:
    """Copy an exported model folder to ``models_dir/name``; never overwrites."""
    if not _NAME.match(name):
        raise ValueError(f"model name {name!r}: use letters, digits, '.', '_' or '-'")
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
