"""The dashboard's audit log: every sign-in, refusal, sign-out and run viewed, one JSON line
each (time, event, user, role, page, run, client address), in a file that the standard
library's RotatingFileHandler rotates. Its files are private to the dashboard's user (0600,
rotated ones too): who looked at which patient cohort is itself sensitive. It lives outside
the run store: the dashboard never writes there."""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import threading
import time
from pathlib import Path

AUDIT_LOG_ENV = "FED_AUC_AUDIT_LOG"
MAX_BYTES = 5 * 1024 * 1024  # then audit.log → audit.log.1 …
BACKUPS = 10
MODE = 0o600


class _PrivateFileHandler(logging.handlers.RotatingFileHandler):
    """Opens (and after each rollover, creates) the log with mode 0600, whatever the umask;
    a file already there with a wider mode is narrowed first."""

    def _open(self):  # type: ignore[no-untyped-def]
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT, MODE)
        os.fchmod(fd, MODE)
        return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)


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
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            handler = _PrivateFileHandler(
                path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8"
            )
            handler.setFormatter(logging.Formatter("%(message)s"))
            logger.addHandler(handler)
            _loggers[path] = logger
        return _loggers[path]


def record(
    path: Path,
    event: str,
    user: str,
    role: str | None,
    page: str,
    run: str | None = None,
    client: str | None = None,
) -> None:
    """Append one event; ``role`` is None for someone the access file does not name, ``run``
    the run shown (None: none yet), ``client`` the connection's address (Streamlit gives
    none for a browser on this machine: "local")."""
    line = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "event": event,
        "user": user,
        "role": role,
        "page": page,
        "run": run,
        "client": client or "local",
    }
    _logger(path).info(json.dumps(line, ensure_ascii=False))


def read(path: str | Path) -> list[dict]:
    """Every event in ``path`` (the current file only), oldest first: for tests and reviews."""
    text = Path(path).read_text(encoding="utf-8") if Path(path).exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]
