"""The dashboard's audit log: every sign-in, refusal and sign-out, one JSON line each (time,
event, user, role, page), in a file that the standard library's RotatingFileHandler rotates.
It lives outside the run store: the dashboard never writes there."""

from __future__ import annotations

import json
import logging
import logging.handlers
import threading
import time
from pathlib import Path

AUDIT_LOG_ENV = "FED_AUC_AUDIT_LOG"
MAX_BYTES = 5 * 1024 * 1024  # then audit.log → audit.log.1 …
BACKUPS = 10

_lock = threading.Lock()
_loggers: dict[Path, logging.Logger] = {}


def _logger(path: Path) -> logging.Logger:
    """One logger and handler per file in this process (every Streamlit session shares it)."""
    path = path.resolve()
    with _lock:
        if path not in _loggers:
            logger = logging.getLogger(f"fed_auc.dashboard.audit.{len(_loggers)}")
            logger.propagate = False  # not into Streamlit's console log
            logger.setLevel(logging.INFO)
            path.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.handlers.RotatingFileHandler(
                path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8"
            )
            handler.setFormatter(logging.Formatter("%(message)s"))
            logger.addHandler(handler)
            _loggers[path] = logger
        return _loggers[path]


def record(path: Path, event: str, user: str, role: str | None, page: str) -> None:
    """Append one event; ``role`` is None for someone the access file does not name."""
    line = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "event": event,
        "user": user,
        "role": role,
        "page": page,
    }
    _logger(path).info(json.dumps(line, ensure_ascii=False))


def read(path: str | Path) -> list[dict]:
    """Every event in ``path`` (the current file only), oldest first: for tests and reviews."""
    text = Path(path).read_text(encoding="utf-8") if Path(path).exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]
