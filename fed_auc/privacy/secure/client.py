"""The site's side of secure aggregation: keys, shares, the mask, and the unmasking shares.

One ``SecureClient`` per node holds one session at a time in memory (a node that restarts
mid-session has dropped out of it, which the protocol survives). Keys are fresh for every
session: revealing a dropped site's mask key in one round reveals nothing of another. Before
anything leaves, the node checks what it is told (``checks``): one masked session per round
and phase, its own weight, a graph seed it helped draw, survivors that keep the graph
connected; every share's associated data binds what it was told.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from cryptography.exceptions import InvalidTag

from fed_auc.algorithms.base import Backend, model_part
from fed_auc.exchange import Broadcast, Reply
from fed_auc.exchange.compression import COMPRESS_KEY, seed_for
from fed_auc.privacy.secure import checks, crypto
from fed_auc.privacy.secure.encoding import MASKED, encode_reply, vector_layout, words_for
from fed_auc.privacy.secure.graph import neighbour_count, neighbourhoods
from fed_auc.privacy.secure.messages import (
    CONFIG_KEY,
    SecureAggregationError,
    associated,
    b64,
    pack_shares,
    require,
    unb64,
    unpack_shares,
)


@dataclass
class _Session:
    name: str
    participants: list[str]
    threshold: int
    k: int
    weight: float  # this site's π, checked at advertise
    advertised: dict[str, Any]  # the advertise message, bound into the shares' AAD
    share_key: Any  # X25519 private key for encrypting shares (c_sk)
    mask_key: Any  # X25519 private key for pairwise masks (s_sk)
    nonce: bytes  # this site's part of the graph seed, committed at advertise
    commitments: dict[str, bytes] = field(default_factory=dict)  # members' nonce commitments
    members: list[str] = field(default_factory=list)  # the sites that committed, in order
    graph: dict[str, list[str]] = field(default_factory=dict)  # members → their neighbours
    neighbours: set[str] = field(default_factory=set)  # the sites this one masks/shares with
    context: bytes = b""  # ``checks.context_digest``: in every share's associated data
    keys: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)  # U1: (c_pk, s_pk)
    seed: bytes = b""  # self-mask seed b
    own_shares: tuple[bytes, bytes] = (b"", b"")
    received: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)  # from U2
    masked_with: list[str] = field(default_factory=list)  # U2
    stage: str = "advertised"


class SecureClient:
    """``handle(step, message)`` answers advertise/share/unmask; ``mask`` masks a vector."""

    def __init__(
        self,
        site: str,
        random_bytes: Callable[[int], bytes] = os.urandom,
        owed_weight: float = 1.0,
        ledger: checks.SessionLedger | None = None,
    ) -> None:
        """``random_bytes``: the source of keys and seeds (tests seed it; nodes use the OS).
        ``owed_weight``: this site's w_k (``Backend.site_weight`` of its n). ``ledger``: the
        rounds already masked (None: in memory only)."""
        self.site = site
        self._random = random_bytes
        self.owed_weight = owed_weight
        self.ledger = ledger or checks.SessionLedger(None)
        self._session: _Session | None = None

    def handle(self, step: str, message: Mapping[str, Any]) -> dict[str, Any]:
        if step == "advertise":
            return self._advertise(message)
        if step == "reveal":
            return self._reveal(message)
        if step == "share":
            return self._share(message)
        if step == "unmask":
            return self._unmask(message)
        raise SecureAggregationError(
            f"site {self.site!r}: unknown secure aggregation step {step!r}"
        )

    def _advertise(self, message: Mapping[str, Any]) -> dict[str, Any]:
        where = f"site {self.site!r}, advertise"
        participants = require(message, "participants", list, where)
        threshold = require(message, "threshold", int, where)
        if self.site not in participants or len(set(participants)) != len(participants):
            raise SecureAggregationError(f"{where}: participants {participants} are not valid")
        k = neighbour_count(len(participants), require(message, "neighbours", int, where))
        if not 2 <= threshold <= k + 1:
            raise SecureAggregationError(
                f"{where}: threshold {threshold} must be in 2..{k + 1} (itself and {k} neighbours)"
            )
        name = require(message, "session", str, where)
        weight = checks.check_weights(self.site, participants, message, self.owed_weight, where)
        self.ledger.open(name, where)
        self._session = _Session(
            name=name,
            participants=list(participants),
            threshold=threshold,
            k=k,
            weight=weight,
            advertised={**message, "neighbours": k},
            share_key=crypto.private_key(self._random(crypto.KEY_BYTES)),
            mask_key=crypto.private_key(self._random(crypto.KEY_BYTES)),
            nonce=self._random(checks.NONCE_BYTES),
        )
        return {
            "c_pk": b64(crypto.public_bytes(self._session.share_key)),
            "s_pk": b64(crypto.public_bytes(self._session.mask_key)),
            "commitment": b64(checks.nonce_commitment(name, self.site, self._session.nonce)),
        }

    def _reveal(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """This site's graph nonce, once it holds every member's commitment."""
        session = self._current(message, "advertised", "reveal")
        where = f"site {self.site!r}, reveal"
        texts = require(message, "commitments", dict, where)
        members = [s for s in session.participants if s in texts]
        if len(members) != len(texts) or len(members) < session.threshold:
            raise SecureAggregationError(
                f"{where}: commitments of {sorted(texts)} do not fit the session's participants "
                f"and threshold {session.threshold}"
            )
        commitments = {s: unb64(texts[s], f"{where}: commitment of {s}") for s in members}
        own = checks.nonce_commitment(session.name, self.site, session.nonce)
        if commitments.get(self.site) != own:
            raise SecureAggregationError(f"{where}: the server relayed another commitment as ours")
        session.commitments, session.members = commitments, members
        session.stage = "committed"
        return {"nonce": b64(session.nonce)}

    def _share(self, message: Mapping[str, Any]) -> dict[str, Any]:
        session = self._current(message, "committed", "share")
        where = f"site {self.site!r}, share"
        texts = require(message, "reveals", dict, where)
        reveals = {s: unb64(t, f"{where}: nonce of {s}") for s, t in texts.items()}
        checks.check_reveals(session.name, session.commitments, reveals, where)
        seed = checks.graph_seed(session.name, session.members, reveals)
        session.graph = neighbourhoods(session.members, session.k, seed)
        session.neighbours = set(session.graph[self.site])
        session.context = checks.context_digest(session.advertised, session.members, seed)
        keys = require(message, "keys", dict, where)
        order = [s for s in session.members if s in keys]
        if len(order) != len(keys) or self.site not in keys:
            raise SecureAggregationError(f"{where}: keys of {sorted(keys)} do not fit the session")
        strangers = set(order) - session.neighbours - {self.site}
        if strangers:
            raise SecureAggregationError(
                f"{where}: keys of {sorted(strangers)}, not neighbours of this site on the "
                "session's graph: refusing to share with them"
            )
        if len(order) < session.threshold:
            raise SecureAggregationError(
                f"{where}: {len(order)} sites advertised keys, fewer than the threshold "
                f"{session.threshold}"
            )
        for site in order:
            pair = require(keys, site, list, where)
            session.keys[site] = (unb64(pair[0], f"{where}: c_pk of {site}"),
                                  unb64(pair[1], f"{where}: s_pk of {site}"))  # fmt: skip
        own = (
            crypto.public_bytes(session.share_key),
            crypto.public_bytes(session.mask_key),
        )
        if session.keys[self.site] != own:
            raise SecureAggregationError(f"{where}: the server relayed other keys as this site's")
        if len({pk for pair in session.keys.values() for pk in pair}) != 2 * len(order):
            raise SecureAggregationError(f"{where}: two sites advertised the same key")
        session.seed = self._random(crypto.KEY_BYTES)
        count = len(order)
        seed_shares = crypto.split_secret(session.seed, session.threshold, count)
        key_shares = crypto.split_secret(
            crypto.private_bytes(session.mask_key), session.threshold, count
        )
        out = {}
        commitments = {}
        for index, site in enumerate(order):
            pair = (seed_shares[index], key_shares[index])
            commitments[site] = [
                b64(crypto.share_commitment(session.name, self.site, site, kind, share))
                for kind, share in zip(("seed", "key"), pair, strict=True)
            ]
            if site == self.site:
                session.own_shares = pair
                continue
            key = crypto.shared_key(session.share_key, session.keys[site][0], crypto.SHARE_INFO)
            nonce = self._random(crypto.NONCE_BYTES)
            sealed = crypto.encrypt(
                key, nonce, pack_shares(*pair),
                associated(session.name, self.site, site, session.context),
            )  # fmt: skip
            out[site] = b64(sealed)
        session.stage = "shared"
        return {
            "shares": out,
            "commitments": commitments,
            "seed_commitment": b64(crypto.seed_commitment(session.name, self.site, session.seed)),
        }

    def masked_reply(self, reply: Reply, broadcast: Broadcast, backend: Backend) -> Reply:
        """The reply as it leaves under secure aggregation: its counts and metrics, and one
        masked vector of everything the server sums (with what ``complete_reply`` adds, which
        the server can no longer derive from this reply alone)."""
        config = broadcast.config[CONFIG_KEY]
        where = f"site {self.site!r}, mask"
        weight = require(config, "weight", float, where)
        excluded = require(config, "excluded", list, where)
        session = self._current(config, "shared", "mask")
        if weight != session.weight:
            raise SecureAggregationError(
                f"{where}: weight {weight!r}, not the {session.weight!r} advertised: refusing"
            )
        if self.ledger.round_phase(session.name, where) != (broadcast.round, broadcast.phase):
            raise SecureAggregationError(
                f"{where}: session {session.name!r} does not name round {broadcast.round} "
                f"phase {broadcast.phase!r} of the request: refusing"
            )
        completed = backend.complete_reply(reply, broadcast)
        layout = vector_layout(backend, broadcast, excluded)
        # --compress fp16: 32-bit words of the update from the broadcast received, one step
        compress = broadcast.config.get(COMPRESS_KEY, "none")
        form = words_for(compress)
        base = None if compress == "none" else model_part(broadcast.tensors)
        rng = None
        if compress != "none":
            rng = np.random.default_rng(
                seed_for("secure", self.site, broadcast.round, broadcast.phase)
            )
        # The server sums up to every sampled site of the session, not only this site's
        # neighbourhood: a value must fit that many times, or the sum wraps around.
        participants = len(session.participants)
        words = encode_reply(completed, layout, weight, participants, form, base, rng)
        masked = self.mask(words, config)
        vector = torch.from_numpy(masked.view(form.signed))
        return dataclasses.replace(reply, tensors={MASKED: vector})

    def mask(self, words: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
        """``words`` (the encoded reply, uint64 or uint32) + PRG(b) + Σ_j ±PRG(s_ij) mod 2^64 (or
        2^32), over the
        neighbours j that shared keys (``config["shares"]``: their encrypted shares for this
        site)."""
        session = self._current(config, "shared", "mask")
        where = f"site {self.site!r}, mask"
        shares = require(config, "shares", dict, where)
        group = [s for s in session.participants if s in shares or s == self.site]
        if len(group) != len(shares) + 1 or not set(group) <= set(session.keys):
            raise SecureAggregationError(f"{where}: shares from {sorted(shares)} do not fit")
        if len(group) < session.threshold:
            raise SecureAggregationError(
                f"{where}: {len(group)} sites shared keys, fewer than the threshold "
                f"{session.threshold}"
            )
        commitments = require(config, "commitments", dict, where)
        for site, sealed in shares.items():
            key = crypto.shared_key(session.share_key, session.keys[site][0], crypto.SHARE_INFO)
            try:
                plain = crypto.decrypt(
                    key, unb64(sealed, f"{where}: share of {site}"),
                    associated(session.name, site, self.site, session.context),
                )  # fmt: skip
            except (InvalidTag, ValueError):  # altered, or too short to hold a nonce and tag
                raise SecureAggregationError(
                    f"{where}: the share from {site!r} fails authentication"
                ) from None
            received = unpack_shares(plain)
            published = require(commitments, site, list, where)
            if len(published) != 2:
                raise SecureAggregationError(f"{where}: commitments of {site!r} are malformed")
            for kind, share, digest in zip(("seed", "key"), received, published, strict=True):
                expected = crypto.share_commitment(session.name, site, self.site, kind, share)
                if len(share) != crypto.SHARE_BYTES or unb64(digest, where) != expected:
                    raise SecureAggregationError(
                        f"{where}: the {kind} share from {site!r} does not match the commitment "
                        f"{site!r} published"
                    )
            session.received[site] = received
        masked = words + crypto.mask(session.seed, len(words), words.dtype)
        position = group.index(self.site)
        for index, site in enumerate(group):
            if site == self.site:
                continue
            pairwise = crypto.mask(self.pair_seed(session, site), len(words), words.dtype)
            masked = masked + pairwise if position < index else masked - pairwise
        self.ledger.record(session.name, where)  # on disk before the vector leaves
        session.masked_with = group
        session.stage = "masked"
        return masked

    @staticmethod
    def pair_seed(session: _Session, other: str) -> bytes:
        return crypto.shared_key(
            session.mask_key, session.keys[other][1], crypto.MASK_INFO + session.name.encode()
        )

    def _unmask(self, message: Mapping[str, Any]) -> dict[str, Any]:
        session = self._current(message, "masked", "unmask")
        where = f"site {self.site!r}, unmask"
        everyone = checks.check_survivors(
            self.site, message.get("survivors"), session.members, session.graph,
            session.threshold, where,
        )  # fmt: skip
        # one list for the whole session: this site's neighbours in it survived, the others
        # that masked with it dropped (never both shares of one site)
        survivors = [s for s in session.masked_with if s in everyone]
        dropped = [s for s in session.masked_with if s not in everyone]
        shares = {**session.received, self.site: session.own_shares}
        self._session = None  # each session unmasks once
        return {
            "b_shares": {s: b64(shares[s][0]) for s in survivors},
            "sk_shares": {s: b64(shares[s][1]) for s in dropped},
        }

    def _current(self, message: Mapping[str, Any], stage: str, step: str) -> _Session:
        name = require(message, "session", str, f"site {self.site!r}, {step}")
        session = self._session
        if session is None or session.name != name:
            raise SecureAggregationError(
                f"site {self.site!r}, {step}: no open session {name!r} (this node may have "
                "restarted: it dropped out of the session)"
            )
        if session.stage != stage:
            raise SecureAggregationError(
                f"site {self.site!r}, {step}: session {name!r} is at {session.stage!r}, "
                f"expected {stage!r}"
            )
        return session
