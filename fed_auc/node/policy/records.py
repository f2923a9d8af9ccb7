"""What a node's policy keeps on disk: its refusal log and small JSON records, private to the
node's user (folders 0700, files 0600) whatever the umask: they name experiments, runs and the
privacy spent on the site's data.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

REFUSALS_FILE = "refusals.log"


def private_folder(folder: Path) -> Path:
    """``folder`` (and its parents) created if missing, readable by the node's user only."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    return folder


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with a 0600 file holding ``text``."""
    private_folder(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_json(path: Path, default: Any) -> Any:
    if not path.exists():
        return default
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable policy record: {exc}") from None


def record_refusal(folder: Path | None, site: str, kind: str, rule: str, message: str) -> None:
    """Append one JSON line to ``<folder>/refusals.log`` (0600): when, which request, which
    rule, why. ``folder`` None: a node that keeps no records (a test)."""
    if folder is None:
        return
    path = private_folder(folder) / REFUSALS_FILE
    line = json.dumps(
        {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "site": site,
            "request": kind,
            "rule": rule,
            "message": message,
        }
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(line + "\n")
    os.chmod(path, 0o600)
