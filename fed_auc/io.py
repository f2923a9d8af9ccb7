"""Atomic file writes: a crash leaves the old file or the new one, never half of either.

States (server checkpoints, node local states) are also checksummed: a file that was cut
short or altered on disk is refused with an error naming it, instead of being half-loaded.
"""

from __future__ import annotations

import hashlib
import io
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
    _fsync_dir(path.parent)


def remove_stale_temporaries(path: str | Path) -> int:
    """Delete temporaries a killed writer of ``path`` left behind; returns how many."""
    path = Path(path)
    stale = list(path.parent.glob(f".{path.name}.*.tmp")) if path.parent.exists() else []
    for tmp in stale:
        tmp.unlink(missing_ok=True)
    return len(stale)


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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


_PACKED = "__packed_tensors__"


def pack(tree: Any) -> Any:
    """Replace every dict of same-dtype tensors by one flat buffer plus a name/shape index.

    ``torch.save`` writes one record per tensor storage, so a DenseNet's ~700 small tensors
    cost far more to save and load than one buffer of the same bytes.
    """
    if isinstance(tree, dict):
        values = list(tree.values())
        if (
            values
            and all(isinstance(v, torch.Tensor) for v in values)
            and len({v.dtype for v in values}) == 1
        ):
            return {
                _PACKED: True,
                "names": list(tree),
                "shapes": [list(v.shape) for v in values],
                "flat": torch.cat([v.detach().reshape(-1) for v in values]),
            }
        return {k: pack(v) for k, v in tree.items()}
    return tree


def unpack(tree: Any) -> Any:
    """Inverse of ``pack``: tensors come back as views of the one loaded buffer."""
    if isinstance(tree, dict):
        if tree.get(_PACKED) is True:
            sizes = [int(torch.Size(s).numel()) for s in tree["shapes"]]
            parts = torch.split(tree["flat"], sizes)
            return {
                name: part.view(shape)
                for name, part, shape in zip(tree["names"], parts, tree["shapes"], strict=True)
            }
        return {k: unpack(v) for k, v in tree.items()}
    return tree


STATE_MAGIC = b"FED-AUC-STATE/1\n"


class CorruptState(ValueError):
    """A state file that is truncated, altered or not a fed-auc state at all."""


def save_state(obj: Any, path: str | Path) -> None:
    """Save a state packed, checksummed (SHA-256 of the payload) and atomically."""
    buffer = io.BytesIO()
    torch.save(pack(obj), buffer)
    payload = buffer.getvalue()
    digest = hashlib.sha256(payload).hexdigest().encode()

    def write(f) -> None:
        f.write(STATE_MAGIC + digest + b"\n")
        f.write(payload)

    _atomic(Path(path), write)


def load_state(path: str | Path) -> Any:
    """Load a state written by ``save_state``; ``CorruptState`` if it does not check out."""
    data = Path(path).read_bytes()
    header = len(STATE_MAGIC) + 65
    if not data.startswith(STATE_MAGIC) or len(data) < header:
        raise CorruptState(f"{path}: not a fed-auc state file (no {STATE_MAGIC!r} header)")
    digest, payload = data[len(STATE_MAGIC) : header - 1], data[header:]
    if hashlib.sha256(payload).hexdigest().encode() != digest:
        raise CorruptState(
            f"{path}: checksum mismatch ({len(payload)} payload bytes): truncated or altered"
        )
    return unpack(torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True))
