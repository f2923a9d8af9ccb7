"""Which key may speak for which site: a site name is bound to one node key per run.

A node says which site it serves when it registers; Flower's node authentication proves only
that it holds *a* registered key. Without a binding, a second node with any registered key
that says it is an already joined site takes that site's place. Here each site is bound to
the key of ``keys/<site>.pub`` from the start, and the run's record keeps the binding made at
its first registration (``site_keys``: site → fingerprint), so a resumed coordinator holds
the same one. A node whose key is not its claimed site's is refused (an impersonation
attempt); the same key coming back under a new Flower node id is a reconnect.

Fingerprints are OpenSSH's (``SHA256:`` and the unpadded base64 of the SHA-256 of the key's
wire form), so an operator checks one with ``ssh-keygen -lf keys/<site>.pub``.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization


def fingerprint(public_key: bytes | str) -> str:
    """OpenSSH's SHA-256 fingerprint of a public key in OpenSSH format (a ``.pub`` line)."""
    key = serialization.load_ssh_public_key(
        public_key.encode() if isinstance(public_key, str) else public_key
    )
    wire = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    digest = hashlib.sha256(base64.b64decode(wire.split()[1])).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def key_file_fingerprint(path: str | Path) -> str | None:
    """The fingerprint of the public half of an OpenSSH private key file (a node's
    ``--auth-key``); None if it is not one (its SuperNode then says why it fails)."""
    try:
        key = serialization.load_ssh_private_key(Path(path).read_bytes(), password=None)
        public = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    except (OSError, ValueError, TypeError, UnsupportedAlgorithm):
        return None
    return fingerprint(public)


def read_site_keys(keys_dir: str | Path) -> dict[str, str]:
    """site → fingerprint of ``keys_dir/<site>.pub``; two sites with one key are refused,
    since either of them could then speak for the other."""
    keys_dir = Path(keys_dir)
    sites: dict[str, str] = {}
    owner: dict[str, str] = {}  # fingerprint → the first site listed with it
    for path in sorted(keys_dir.glob("*.pub")):
        try:
            key = fingerprint(path.read_bytes())
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: not an OpenSSH public key ({exc})") from None
        if key in owner:
            raise ValueError(
                f"{keys_dir}: sites {owner[key]!r} and {path.stem!r} are listed with the same "
                f"public key ({key}); every site needs a key of its own (`fed-auc certs`)"
            )
        owner[key] = path.stem
        sites[path.stem] = key
    return sites


class SiteIdentities:
    """The coordinator's side of the binding: which key each Flower node holds and which
    key each site is bound to."""

    def __init__(self, node_keys: Mapping[int, str], bound: Mapping[str, str]) -> None:
        """``node_keys``: Flower node id → fingerprint of its registered key (empty without
        node authentication: nothing is then checked); ``bound``: site → fingerprint."""
        self.node_keys = dict(node_keys)
        self.bound = dict(bound)
        owner: dict[str, str] = {}
        for site, key in self.bound.items():
            if key in owner:
                raise ValueError(
                    f"sites {owner[key]!r} and {site!r} are bound to the same key ({key})"
                )
            owner[key] = site

    @property
    def checked(self) -> bool:
        return bool(self.node_keys)

    @classmethod
    def for_run(
        cls, experiment: Mapping[str, Any], recorded: Mapping[str, Any], run_id: str
    ) -> SiteIdentities:
        """From what ``fed-auc coordinator`` registered (``experiment["node_keys"]``: node id
        → site of the key file and fingerprint) and the run's record (``site_keys``, kept
        from its first registration, which wins over a key file changed since)."""
        registered = experiment.get("node_keys") or {}
        recorded_keys = dict(recorded.get("site_keys") or {})
        if recorded_keys and not registered:
            raise ValueError(
                f"run {run_id} bound its sites to node keys ({sorted(recorded_keys)}); "
                "continue it with [flower] certs_dir set, not insecure"
            )
        files = {entry["site"]: entry["fingerprint"] for entry in registered.values()}
        try:
            return cls(
                {int(node): entry["fingerprint"] for node, entry in registered.items()},
                {**files, **recorded_keys},
            )
        except ValueError as exc:
            raise ValueError(
                f"run {run_id}: the keys registered now disagree with the keys its sites "
                f"registered with ({exc}); a site's key changes between runs, not within one"
            ) from None

    def claim(self, site: str, node: int) -> str | None:
        """None if Flower node ``node`` holds the key ``site`` is bound to, else why not: an
        impersonation attempt, for the log."""
        if not self.checked:
            return None
        key = self.node_keys.get(node)
        if key is None:
            return (
                f"impersonation attempt: a node says it is site {site} but holds no key "
                "registered by this coordinator; refused"
            )
        bound = self.bound.get(site)
        if bound == key:
            return None
        owner = next((s for s, k in self.bound.items() if k == key), None)
        holder = f"the key of site {owner}" if owner else "a key bound to no site"
        expected = f"which is bound to key {bound}" if bound else "which has no registered key"
        return (
            f"impersonation attempt: a node with {holder} ({key}) says it is site {site}, "
            f"{expected}; refused, site {site} keeps its place"
        )

    def record(self, sites: list[str]) -> dict[str, Any]:
        """What the run's record keeps (``site_keys``: site → fingerprint of the given
        sites); nothing without node authentication."""
        if not self.checked:
            return {}
        return {"site_keys": {site: self.bound[site] for site in sites if site in self.bound}}
