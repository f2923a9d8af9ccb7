"""Reading a weight file without executing it, and converting one that needs code to read.

A ``.pt``/``.pth`` file is opened with ``torch.load(weights_only=True)`` (tensors, containers,
numbers and strings only) and a ``.safetensors`` file with safetensors; neither runs code
from the file. A file that holds a pickled ``nn.Module`` (torchxrayvision's downloads, a
``torch.save(model)``) is refused with the command that converts it, once, where the
operator trusts the file and has the code that defines the module: ``fed-auc
convert-weights``.
"""

from __future__ import annotations

import hashlib
import pickletools
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SAFETENSORS = ".safetensors"
_WRAPPERS = ("state_dict", "model_state_dict", "model")  # common checkpoint layouts


@dataclass(frozen=True)
class WeightFile:
    """A file's tensors by name, its SHA-256, and its whole content (a registered model's
    ``model.pt`` carries its config beside the tensors)."""

    path: Path
    sha256: str
    tensors: dict[str, torch.Tensor]
    content: Any


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_weight_file(path: str | Path) -> WeightFile:
    """The tensors of ``path``, read without executing anything in it; a file that cannot
    be read that way is refused with its name and the reason."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"weights {path}: no such file")
    if path.suffix == SAFETENSORS:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            content: Any = load_file(str(path), device="cpu")
        except (SafetensorError, OSError) as exc:
            raise ValueError(f"weights {path}: not a readable safetensors file ({exc})") from None
    else:
        content = _torch_load(path)
    return WeightFile(path, sha256(path), _state_dict(content, path), content)


ACCEPTED = (
    "--init takes a torch .pt/.pth file of tensors (torch.save of a state_dict), a "
    ".safetensors file, or a registered model's folder"
)
_ZIP, _PICKLE = b"PK\x03\x04", 0x80  # torch.save's zip archive; a pickle's PROTO opcode


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for foreign, pickled or cut files
        text = str(exc)
        if "Unsupported global" in text:  # the pickle names a class: code to run
            found = _unsupported_global(text)
            raise ValueError(
                f"weights {path}: holds pickled code ({found}), not just tensors; fed-auc "
                "never unpickles code. Convert it once, where you trust the file and the "
                f"code that defines it is installed: `fed-auc convert-weights {path} "
                f"{path.with_suffix(SAFETENSORS)}`, then give that file"
            ) from None
        raise ValueError(
            f"weights {path}: cannot be read: {_what_it_is(path, exc)}; {ACCEPTED}"
        ) from None


def _what_it_is(path: Path, exc: Exception) -> str:
    """What a file torch cannot read looks like, from its first bytes: a cut torch archive,
    a pickle of something else, or bytes of no known kind; torch's reason where it has one."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    after = [b for a, b in zip(lines, lines[1:], strict=False) if "WeightsUnpickler" in a]
    reason = f"{type(exc).__name__}: {(after or lines or [''])[0].split('. ')[0][:100]}"
    if not head:
        return "an empty file (0 bytes)"
    if head.startswith(_ZIP):
        if zipfile.is_zipfile(path):
            return f"a zip archive of {size} bytes without tensors torch can read ({reason})"
        return f"a torch file (zip), truncated or damaged ({size} bytes; {reason})"
    if head[0] == _PICKLE and _is_pickle(path):
        return (
            f"a Python pickle of {size} bytes (an old-style torch file, cut, or another "
            f"pickle) that torch's tensors-only loader cannot read ({reason})"
        )
    return f"{size} bytes that are not a torch file (neither zip nor pickle: {head.hex(' ')} …)"


def _is_pickle(path: Path) -> bool:
    """Whether the file's first pickle parses (opcodes only: nothing is built or run)."""
    try:
        with path.open("rb") as f:
            for _ in pickletools.genops(f):
                pass
    except Exception:  # pickletools raises ValueError, EOFError or others on bytes
        return False
    return True


def _unsupported_global(text: str) -> str:
    """The class the pickle names (``GLOBAL module.Class``), as torch reports it."""
    for line in text.splitlines():
        if "Unsupported global" in line:
            return line.split("Unsupported global:", 1)[-1].strip().rstrip(".") or line
    return "a Python object torch's weights-only loader refuses"


def _state_dict(content: Any, path: Path) -> dict[str, torch.Tensor]:
    """The name -> tensor mapping inside ``content``: the dict itself, or the one under a
    usual checkpoint key; a ``module.`` prefix (DataParallel) dropped."""
    if isinstance(content, dict) and not _all_tensors(content):
        inner = next((content[k] for k in _WRAPPERS if isinstance(content.get(k), dict)), None)
        if inner is None:
            raise ValueError(
                f"weights {path}: a dict without tensors at its top level or under "
                f"{list(_WRAPPERS)}; keys: {sorted(map(str, content))[:8]}"
            )
        content = inner
    if not isinstance(content, dict) or not _all_tensors(content):
        bad = (
            next(k for k, v in content.items() if not isinstance(v, torch.Tensor))
            if isinstance(content, dict)
            else type(content).__name__
        )
        raise ValueError(f"weights {path}: not a state_dict of tensors (first offender: {bad!r})")
    if all(str(k).startswith("module.") for k in content):
        content = {str(k)[len("module.") :]: v for k, v in content.items()}
    return {str(k): v for k, v in content.items()}


def _all_tensors(content: dict) -> bool:
    return bool(content) and all(isinstance(v, torch.Tensor) for v in content.values())


def convert_weights(source: str | Path, target: str | Path) -> str:
    """Unpickle ``source`` (this runs its code: only for a file you trust, with the package
    that defines its module installed) and write its state_dict to ``target``, safetensors
    for a ``.safetensors`` name, else a tensors-only torch file. Returns what it did."""
    source, target = Path(source), Path(target)
    if target.exists():
        raise ValueError(f"convert-weights: {target} exists; choose a new name")
    try:
        content = torch.load(source, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ValueError(
            f"convert-weights: cannot unpickle {source} ({type(exc).__name__}: {exc}); is "
            "the package that defines its classes installed here?"
        ) from None
    kind = type(content).__name__
    if isinstance(content, torch.nn.Module):
        content = content.state_dict()
    tensors = _state_dict(content, source)
    tensors = {k: v.detach().clone().contiguous() for k, v in tensors.items()}
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.suffix == SAFETENSORS:
        from safetensors.torch import save_file

        save_file(tensors, str(target))
    else:
        torch.save(tensors, target)
    return (
        f"read {source} (a pickled {kind}, SHA-256 {sha256(source)}): {len(tensors)} tensors; "
        f"wrote them to {target} ({'safetensors' if target.suffix == SAFETENSORS else 'torch'}"
        f", tensors only, SHA-256 {sha256(target)}); give it to --init"
    )
