"""What a site operator needs to know about ``fed-auc node``'s SuperNode, in one line each.

Flower's SuperNode says why it cannot join only in its own log (``<state_dir>/supernode.log``)
and exits with 1 for all of it. ``SupernodeWatch`` reads that log as it grows and turns the
messages it knows into a line for the node's console: nothing answers at the coordinator's
address, the CA does not match the coordinator's certificate, the SuperLink does not know this
node's key, the SuperLink forgot this node, something listens there that the SuperNode cannot
talk to (TLS on one side only). ``lock_state_dir`` keeps a second node off a state
directory that a running node uses (both would write the same local state).

A SuperLink refuses an unknown key and a key whose previous session it still holds (a node
restarted within Flower's heartbeat patience) with the same message. A node that joined this
coordinator with this key before (``<state_dir>/joined.json``) is told the second for
``REJOIN_PATIENCE_S``, the first only after that. A coordinator registers its sites' keys just
after its SuperLink starts, so any node is refused for a moment at a coordinator's start: a node
that never joined is told its key is unknown only after ``STARTUP_PATIENCE_S`` of refusals.

The messages are Flower 1.4x's (checked on loopback, see tests/e2e/test_flower_faults.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

LOCK_FILE = "node.lock"

# Markers in the SuperNode's log, most specific first.
CONNECTED = "SuperNode ID:"  # "SuperNode ID: 1348...": it joined the SuperLink
UNREACHABLE = "Connection attempt failed"  # nothing accepts connections at the address
TLS_FAILED = ("CERTIFICATE_VERIFY_FAILED", "SSL/TLS handshake error")
NOT_REGISTERED = ("Failed to activate SuperNode", "[code: 2004]")
REFUSED = "401 Unauthorized"  # a SuperLink that does not know this node (e.g. restarted)


# How long a SuperLink holds the session of a node that went away: Flower's HEARTBEAT_PATIENCE
# x HEARTBEAT_DEFAULT_INTERVAL (flwr.common.constant); the node's restart is refused until then.
SESSION_HELD_S = 2 * 30.0
REJOIN_PATIENCE_S = 180.0  # then a refusal of a node that joined before means its key is gone
# (3 x SESSION_HELD_S: on a loaded CI machine a restarted node was refused for over 90 s)
STARTUP_PATIENCE_S = 30.0  # then a refusal of any other node means its key is not registered
JOINED_FILE = "joined.json"


@dataclass(frozen=True)
class Joined:
    """The coordinator this node last joined, and with which key (its fingerprint)."""

    address: str
    key: str | None  # None: --insecure, no key

    @classmethod
    def read(cls, state_dir: Path) -> Joined | None:
        try:
            record = json.loads((state_dir / JOINED_FILE).read_text())
            return cls(record["address"], record["key"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, state_dir: Path) -> None:
        (state_dir / JOINED_FILE).write_text(json.dumps(asdict(self)) + "\n")


class StateDirBusy(RuntimeError):
    """Another ``fed-auc node`` holds the state directory's lock."""


_held: dict[Path, list[int]] = {}  # lock file → [descriptor, holds] of this process


def lock_state_dir(state_dir: Path) -> Path:
    """Hold ``state_dir/node.lock`` until ``unlock_state_dir`` or the process ends (the
    kernel releases it however the process ends); a second node on the same directory is
    refused at once with ``StateDirBusy``. A process may take it again (it counts holds)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = (state_dir / LOCK_FILE).resolve()
    if path in _held:
        _held[path][1] += 1
        return path
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode("ascii", "replace").strip()
        os.close(fd)
        who = f" (process {holder})" if holder.isdigit() else ""
        raise StateDirBusy(
            f"another node is running on this state directory {state_dir}{who}; stop it, "
            "or give this site file its own [node] state_dir"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _held[path] = [fd, 1]
    return path


def unlock_state_dir(path: Path) -> None:
    """Give back one hold of ``lock_state_dir``'s lock; the last one releases it."""
    held = _held.get(path)
    if held is None:
        return
    held[1] -= 1
    if held[1] == 0:
        del _held[path]
        os.close(held[0])


def explain(
    text: str,
    address: str,
    ca: Path | None = None,
    rejoining: bool = False,
    starting: bool = False,
) -> str | None:
    """The one-line cause of a SuperNode failure in its log ``text``, or None if unknown.
    ``rejoining``: this node joined this coordinator with this key before, lately;
    ``starting``: refused for under STARTUP_PATIENCE_S (the coordinator may be starting)."""
    if any(marker in text for marker in TLS_FAILED):
        given = f" (--root-certificates {ca})" if ca is not None else ""
        return (
            f"TLS verification failed: the CA does not match{given}: the certificate of "
            f"{address} is not signed by it; use the ca.pem of this federation's coordinator"
        )
    if any(marker in text for marker in NOT_REGISTERED) and rejoining:
        return (
            f"the coordinator at {address} does not let this node in yet (it still holds this "
            f"node's previous session; it is released within ~{SESSION_HELD_S:g} s)"
        )
    if any(marker in text for marker in NOT_REGISTERED) and starting:
        return (
            f"the coordinator at {address} does not let this node in yet (a coordinator "
            f"registers its sites' keys just after it starts; still refused after "
            f"{STARTUP_PATIENCE_S:g} s means this key is not registered there)"
        )
    if any(marker in text for marker in NOT_REGISTERED):
        return (
            f"this key is not registered at the coordinator {address}: its operator must "
            "add this site's .pub to the federation's keys (fed-auc certs) and restart it, "
            "or --auth-key is not this site's key"
        )
    if REFUSED in text:
        return f"the coordinator at {address} does not know this node (401: it restarted?)"
    if UNREACHABLE in text:
        return (
            f"cannot reach {address}: nothing answers there (is the coordinator running, "
            "the host and port right, the port open?)"
        )
    return None


@dataclass
class SupernodeWatch:
    """Lines for the node's console from one SuperNode's log, as it grows: a cause once (not
    at every retry), its end when the SuperNode joins, and why it exited."""

    site: str
    address: str
    ca: Path | None = None
    state_dir: Path | None = None  # where the joined record is kept (None: nowhere)
    key: str | None = None  # the fingerprint of the node's key (None: --insecure)
    said: str | None = None  # the last cause reported (reported again only if it changes)
    refused_since: float | None = None  # the first refused activation since it last joined
    ended: bool = False  # the coordinator said its run ended: it is expected to go away
    _seen: str = field(default="", repr=False)

    def heard(self, kind: str) -> None:
        """The coordinator sent a request of ``kind``: after ``end`` (its run ended) losing it
        is no fault and nothing is said; after any other request it is one again."""
        self.ended = kind == "end"

    def feed(self, text: str) -> list[str]:
        """The log of the current SuperNode so far (from its start): lines to print now."""
        new, self._seen = text[len(self._seen) :], text
        if CONNECTED in new:
            joined = self.said is not None
            self.said, self.ended, self.refused_since = None, False, None
            if self.state_dir is not None:
                Joined(self.address, self.key).write(self.state_dir)
            if joined:
                return [f"{self.site}: connected to the coordinator at {self.address}"]
            return []
        if UNREACHABLE not in new:  # the other causes end the SuperNode: said at its exit
            return []
        cause = explain(UNREACHABLE, self.address, self.ca)
        if self.listening():  # something answers: the SuperNode cannot talk to it
            cause = (
                f"{self.address} accepts connections but the SuperNode cannot talk to it: "
                "TLS on one side only? (--insecure against a coordinator with TLS, or the "
                "address of another service)"
            )
        if cause == self.said:
            return []
        self.said = cause  # after the end of a run, kept to say when the node connects again
        return [] if self.ended else [f"{self.site}: {cause}; retrying"]

    def listening(self) -> bool:
        """Whether anything accepts a TCP connection at the address now."""
        host, _, port = self.address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1):
                return True
        except (OSError, ValueError):
            return False

    def exited(self, returncode: int | None, log_path: Path) -> str:
        """The line for a SuperNode that exited (it is restarted after it)."""
        rejoining, starting = self._refused_lately()
        cause = explain(self._seen, self.address, self.ca, rejoining, starting)
        self._seen = ""
        if cause is None:
            return (
                f"{self.site}: SuperNode exited with {returncode}; restarting (its log: {log_path})"
            )
        if cause == self.said:  # said already at its previous exit: one line, not one per try
            return ""
        self.said = cause
        if self.ended and cause == explain(REFUSED, self.address):  # the next run's SuperLink
            return ""  # is a new one: expected after the end of a run; "connected" follows
        return f"{self.site}: {cause}; retrying"

    def _refused_lately(self) -> tuple[bool, bool]:
        """(rejoining, starting) for a refused activation: whether the coordinator may still hold
        this node's previous session (it joined there with this key, refused for under
        REJOIN_PATIENCE_S), or may be registering its keys (refused for under
        STARTUP_PATIENCE_S)."""
        if not any(marker in self._seen for marker in NOT_REGISTERED):
            return False, False
        if self.refused_since is None:
            self.refused_since = time.monotonic()
        refused_for = time.monotonic() - self.refused_since
        joined = self.state_dir is not None and Joined.read(self.state_dir) == Joined(
            self.address, self.key
        )
        if joined and refused_for < REJOIN_PATIENCE_S:
            return True, False
        return False, refused_for < STARTUP_PATIENCE_S
