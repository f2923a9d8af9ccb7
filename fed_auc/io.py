"""Atomic file writes: a crash leaves the old file or the new one, never half of either."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch


def _atomic(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_torch(obj: Any, path: str | Path) -> None:
    """``torch.save`` through a temporary file and an atomic rename."""
    _atomic(Path(path), lambda f: torch.save(obj, f))


def load_torch(path: str | Path) -> Any:
    """Load tensors, dicts and scalars only (``weights_only``): no code is unpickled."""
    return torch.load(path, map_location="cpu", weights_only=True)


def save_json(obj: Any, path: str | Path) -> None:
    _atomic(Path(path), lambda f: f.write(json.dumps(obj, indent=2).encode()))


def save_text(text: str, path: str | Path) -> None:
    _atomic(Path(path), lambda f: f.write(text.encode()))
