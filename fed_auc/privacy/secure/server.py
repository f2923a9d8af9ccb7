"""The server's side of secure aggregation: relay keys and shares, then remove the masks.

The server sees public keys, ciphertexts it cannot open, and masked vectors that are uniform
in Z_{2^64}. Sites mask with and share with their neighbours on SecAgg+'s graph
(``graph``; the full graph is plain SecAgg). The server unmasks only a sum: from
``threshold`` of each site's neighbourhood (the site and its neighbours) it reconstructs each
survivor's self-mask seed b_j and, for each site that shared keys but whose vector never
arrived (or was rejected), its mask key, from which it recomputes and removes that site's
pairwise masks from its surviving neighbours' vectors. An honest site never reveals both of
one site's secrets (``SecureClient`` checks survivors and dropped are disjoint).

It fails loudly rather than unmask something wrong or more than the sum: every unmasking
share must match the SHA-256 commitment its owner published when it shared (a helper that
sends one that does not is named and none of its shares used), a rebuilt seed must match its
commitment and a rebuilt mask key its public key, and survivors that dropouts split on the
graph are never unmasked (pairwise masks cancel within each group, so each group's sum
would come out).

``SecureServer`` is a sequence of steps, so the transport carries its messages: the
coordinator asks it for each step's requests, sends them with any transport, and hands it
the answers (a failed site's answer is simply absent).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fed_auc.privacy.secure import checks, crypto
from fed_auc.privacy.secure.graph import components, neighbour_count, neighbourhoods
from fed_auc.privacy.secure.messages import SecureAggregationError, b64, require, unb64

# An encrypted pair of shares: nonce, the shares' lengths and bytes, the GCM tag.
_SEALED_BYTES = crypto.NONCE_BYTES + 4 + 2 * crypto.SHARE_BYTES + 16


def default_threshold(count: int) -> int:
    """A majority of the sampled sites, at least 2 (one site's "sum" is its own vector)."""
    return max(2, count // 2 + 1)


class SecureServer:
    def __init__(
        self,
        session: str,
        participants: Sequence[str],
        threshold: int,
        neighbours: int | None = None,
        weights: Mapping[str, float] | None = None,
        unit: float = 1.0,
    ) -> None:
        """``neighbours``: k of SecAgg+'s graph (None: the full graph); ``threshold``: shares
        that rebuild a site's secrets, at most k + 1 (its neighbourhood); ``weights``: each
        participant's π (None: 1 each) and ``unit``, sent at advertise for the sites to check.
        The graph's seed is drawn by the sites (``reveal``), never by the server."""
        if len(participants) < 2:
            raise SecureAggregationError(
                f"secure aggregation needs at least 2 sites per round, got {list(participants)}"
            )
        full = len(participants) - 1
        self.k = full if neighbours is None else neighbour_count(len(participants), neighbours)
        if not 2 <= threshold <= self.k + 1:
            raise SecureAggregationError(
                f"secure aggregation threshold must be in 2..{self.k + 1} (each site's "
                f"neighbourhood: itself and its {self.k} neighbours), got {threshold}"
            )
        self.session = session
        self.participants = list(participants)
        self.threshold = threshold
        self.weights = dict.fromkeys(self.participants, 1.0) if weights is None else dict(weights)
        self.unit = unit
        self.graph_seed = b""  # known once every member revealed its nonce
        self.neighbours: dict[str, list[str]] = {}
        self.keys: dict[str, tuple[bytes, bytes]] = {}  # U1: (c_pk, s_pk)
        self.commitments_of_nonces: dict[str, str] = {}  # U1: each site's graph nonce's
        self.reveals: dict[str, str] = {}
        self.mailbox: dict[str, dict[str, str]] = {}  # destination → source → ciphertext
        self.sharers: list[str] = []  # U2
        # owner → holder → (seed, key) share commitments; owner → its seed's commitment
        self.commitments: dict[str, dict[str, tuple[bytes, bytes]]] = {}
        self.seed_commitments: dict[str, bytes] = {}
        self.problems: list[str] = []  # the unmasking shares rejected, by name (events)

    # -- step 1 -----------------------------------------------------------------------------
    def advertise_requests(self) -> dict[str, dict[str, Any]]:
        message = {
            "session": self.session,
            "participants": self.participants,
            "threshold": self.threshold,
            "neighbours": self.k,
            "weights": {site: self.weights[site] for site in self.participants},
            "unit": self.unit,
        }
        return {site: message for site in self.participants}

    def collect_keys(self, answers: Mapping[str, Any]) -> list[str]:
        """Keep the well-formed answers; returns the sites left out (with why, as events)."""
        problems = []
        for site in self.participants:
            if site not in answers:
                continue
            try:
                where = f"site {site!r}, advertise answer"
                keys = (
                    unb64(require(answers[site], "c_pk", str, where), f"{where}: c_pk"),
                    unb64(require(answers[site], "s_pk", str, where), f"{where}: s_pk"),
                )
                commitment = require(answers[site], "commitment", str, where)
                self._digests([commitment], 1, f"{where}: commitment")
            except SecureAggregationError as exc:
                problems.append(str(exc))
                continue
            self.keys[site] = keys
            self.commitments_of_nonces[site] = commitment
        self._enough(list(self.keys), "advertised keys")
        return problems

    # -- step 2: the graph seed, drawn by the members ------------------------------------------
    def reveal_requests(self) -> dict[str, dict[str, Any]]:
        """Every member gets every member's commitment, then reveals its nonce."""
        message = {"session": self.session, "commitments": self.commitments_of_nonces}
        return {site: message for site in self.keys}

    def collect_reveals(self, answers: Mapping[str, Any]) -> None:
        """The graph from every member's nonce; a member that does not reveal the nonce it
        committed to fails the session (the others refuse a seed it did not help draw)."""
        reveals = {}
        for site in self.keys:
            where = f"site {site!r}, reveal answer"
            if site not in answers:
                raise SecureAggregationError(
                    f"secure aggregation of session {self.session}: {site!r} did not reveal "
                    "its graph nonce: the graph seed cannot be drawn"
                )
            reveals[site] = unb64(require(answers[site], "nonce", str, where), where)
        commitments = {s: unb64(c, s) for s, c in self.commitments_of_nonces.items()}
        checks.check_reveals(self.session, commitments, reveals, "secure aggregation")
        members = list(self.keys)
        self.reveals = {s: b64(n) for s, n in reveals.items()}
        self.graph_seed = checks.graph_seed(self.session, members, reveals)
        self.neighbours = neighbourhoods(members, self.k, self.graph_seed)

    # -- step 3 -----------------------------------------------------------------------------
    def share_requests(self) -> dict[str, dict[str, Any]]:
        """Each site gets its own keys and its neighbours' (those that advertised)."""
        keys = {site: [b64(c), b64(s)] for site, (c, s) in self.keys.items()}
        return {
            site: {
                "session": self.session,
                "reveals": self.reveals,
                "keys": {s: keys[s] for s in self._group(site)},
            }
            for site in self.keys
        }

    def collect_shares(self, answers: Mapping[str, Any]) -> list[str]:
        problems = []
        for site in self.keys:
            if site not in answers:
                continue
            where = f"site {site!r}, share answer"
            try:
                shares = require(answers[site], "shares", dict, where)
                expected = set(self._group(site)) - {site}
                if set(shares) != expected or not all(isinstance(v, str) for v in shares.values()):
                    raise SecureAggregationError(
                        f"{where}: shares for {sorted(shares)}, expected {sorted(expected)}"
                    )
                for destination, sealed in shares.items():
                    if len(unb64(sealed, f"{where}: share for {destination}")) != _SEALED_BYTES:
                        raise SecureAggregationError(
                            f"{where}: the share for {destination!r} is not the length of one"
                        )
                commitments = require(answers[site], "commitments", dict, where)
                if set(commitments) != expected | {site}:
                    raise SecureAggregationError(
                        f"{where}: commitments for {sorted(commitments)}, expected "
                        f"{sorted(expected | {site})}"
                    )
                self.commitments[site] = {
                    holder: self._digests(commitments[holder], 2, f"{where}: commitments")
                    for holder in commitments
                }
                self.seed_commitments[site] = self._digests(
                    [require(answers[site], "seed_commitment", str, where)], 1, where
                )[0]
            except SecureAggregationError as exc:
                problems.append(str(exc))
                continue
            self.sharers.append(site)
            for destination, sealed in shares.items():
                self.mailbox.setdefault(destination, {})[site] = sealed
        self._enough(self.sharers, "shared keys")
        return problems

    # -- step 4 (in the train request) --------------------------------------------------------
    def mask_config(self, site: str) -> dict[str, Any]:
        """The train request's ``secure_aggregation`` entry for ``site`` (one of U2)."""
        shares = {s: c for s, c in self.mailbox.get(site, {}).items() if s in self.sharers}
        commitments = {s: [b64(d) for d in self.commitments[s][site]] for s in shares}
        return {"session": self.session, "shares": shares, "commitments": commitments}

    # -- step 5 -----------------------------------------------------------------------------
    def unmask_requests(self, survivors: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Each survivor is asked for the shares it holds: its neighbourhood's survivors'
        seeds and dropped sites' mask keys."""
        survivors = [s for s in self.sharers if s in survivors]
        self._enough(survivors, "sent a valid masked vector")
        self._connected(survivors)
        return {site: {"session": self.session, "survivors": survivors} for site in survivors}

    def unmask(self, masked: Mapping[str, np.ndarray], answers: Mapping[str, Any]) -> np.ndarray:
        """Σ_k x_k mod 2^64 (2^32 for 32-bit words) over the sites of ``masked`` (the
        survivors), from the survivors' ``answers`` to ``unmask_requests``; at least
        ``threshold`` answers are needed."""
        survivors = [s for s in self.sharers if s in masked]
        dropped = [s for s in self.sharers if s not in masked]
        self._connected(survivors)  # before a single share is combined
        seed_shares: dict[str, list[bytes]] = {s: [] for s in survivors}
        key_shares: dict[str, list[bytes]] = {s: [] for s in dropped}
        helpers = []
        for site in survivors:
            if site not in answers:
                continue
            where = f"site {site!r}, unmask answer"
            group = self._group(site, self.sharers)
            mine = [s for s in group if s in survivors]
            gone = [s for s in group if s in dropped]
            try:
                seeds = require(answers[site], "b_shares", dict, where)
                keys = require(answers[site], "sk_shares", dict, where)
                if set(seeds) != set(mine) or set(keys) != set(gone):
                    raise SecureAggregationError(f"{where}: shares for the wrong sites")
                parsed = [self._verified(site, o, "seed", seeds[o], where) for o in mine]
                parsed_keys = [self._verified(site, o, "key", keys[o], where) for o in gone]
            except SecureAggregationError as exc:  # none of its shares is used
                self.problems.append(f"{exc}: rejected, none of {site!r}'s shares is used")
                continue
            for owner, share in zip(mine, parsed, strict=True):
                seed_shares[owner].append(share)
            for owner, share in zip(gone, parsed_keys, strict=True):
                key_shares[owner].append(share)
            helpers.append(site)
        rejected = f" (rejected: {'; '.join(self.problems)})" if self.problems else ""
        if len(helpers) < self.threshold:
            raise SecureAggregationError(
                f"secure aggregation of session {self.session}: {len(helpers)} of "
                f"{len(survivors)} surviving sites sent their unmasking shares "
                f"({helpers}), fewer than the threshold {self.threshold}: the sum cannot be "
                f"unmasked{rejected}"
            )
        for owner, shares in [*key_shares.items(), *seed_shares.items()]:
            if len(shares) < self.threshold:
                what = "survivor" if owner in seed_shares else "dropped site"
                raise SecureAggregationError(
                    f"secure aggregation of session {self.session}: only {len(shares)} of "
                    f"{what} {owner!r}'s neighbourhood sent its shares, fewer than the "
                    f"threshold {self.threshold}: the sum cannot be unmasked{rejected}"
                )
        length = len(next(iter(masked.values())))
        dtype = next(iter(masked.values())).dtype  # uint64, or uint32 (--compress fp16)
        total = np.zeros(length, dtype=dtype)
        for site in survivors:
            total += masked[site]
            seed = self._combine(seed_shares[site], site, "self-mask seed")
            if crypto.seed_commitment(self.session, site, seed) != self.seed_commitments[site]:
                raise SecureAggregationError(
                    f"secure aggregation of session {self.session}: the shares of survivor "
                    f"{site!r}'s self-mask seed do not rebuild the seed it committed to"
                )
            total -= crypto.mask(seed, length, dtype)
        for site in dropped:
            secret = self._combine(key_shares[site], site, "mask key")
            key = crypto.private_key(secret)
            if crypto.public_bytes(key) != self.keys[site][1]:
                raise SecureAggregationError(
                    f"secure aggregation of session {self.session}: the shares of dropped site "
                    f"{site!r}'s mask key do not rebuild the key it advertised"
                )
            position = self.sharers.index(site)
            for other in (s for s in self.neighbours[site] if s in survivors):
                seed = crypto.shared_key(
                    key, self.keys[other][1], crypto.MASK_INFO + self.session.encode()
                )
                pairwise = crypto.mask(seed, length, dtype)
                # the survivor added +PRG if it came first in the order, −PRG otherwise
                if self.sharers.index(other) < position:
                    total -= pairwise
                else:
                    total += pairwise
        return total

    def _verified(self, holder: str, owner: str, kind: str, text: Any, where: str) -> bytes:
        """``holder``'s ``kind`` share of ``owner``'s secret, if it is the one ``owner``
        committed to; ``SecureAggregationError`` naming both otherwise."""
        share = unb64(text, f"{where}: {kind} share of {owner!r}")
        digest = crypto.share_commitment(self.session, owner, holder, kind, share)
        committed = self.commitments[owner][holder][0 if kind == "seed" else 1]
        if len(share) != crypto.SHARE_BYTES or digest != committed:
            raise SecureAggregationError(
                f"secure aggregation of session {self.session}: site {holder!r} sent a {kind} "
                f"share of {owner!r} ({len(share)} bytes) that does not match the commitment "
                f"{owner!r} published"
            )
        return share

    def _combine(self, shares: list[bytes], owner: str, what: str) -> bytes:
        """The secret of ``threshold`` shares, or ``SecureAggregationError`` naming ``owner``
        (never a library's error from deep inside)."""
        try:
            secret = crypto.combine_secret(shares[: self.threshold])
        except (ValueError, IndexError, TypeError) as exc:
            raise SecureAggregationError(
                f"secure aggregation of session {self.session}: the shares of {owner!r}'s "
                f"{what} do not combine ({exc})"
            ) from None
        if len(secret) != crypto.KEY_BYTES:
            raise SecureAggregationError(
                f"secure aggregation of session {self.session}: the shares of {owner!r}'s "
                f"{what} combine to {len(secret)} bytes, not {crypto.KEY_BYTES}"
            )
        return secret

    def _connected(self, survivors: Sequence[str]) -> None:
        """Refuse to unmask survivors that dropouts split on the graph: their pairwise masks
        cancel within each group, so unmasking would reveal each group's sum."""
        groups = components(survivors, self.neighbours)
        if len(groups) > 1:
            dropped = [s for s in self.sharers if s not in survivors]
            raise SecureAggregationError(
                f"secure aggregation of session {self.session}: the dropped sites {dropped} "
                f"split the {len(survivors)} surviving sites into {len(groups)} groups on the "
                f"session's graph ({groups}); unmasking would reveal each group's sum, not only "
                "the total: refusing to unmask"
            )

    @staticmethod
    def _digests(texts: Any, count: int, where: str) -> tuple[bytes, ...]:
        if not isinstance(texts, list) or len(texts) != count:
            raise SecureAggregationError(f"{where}: expected {count} commitments")
        digests = tuple(unb64(t, where) for t in texts)
        if any(len(d) != crypto.DIGEST_BYTES for d in digests):
            raise SecureAggregationError(f"{where}: a commitment is not a SHA-256 digest")
        return digests

    def _group(self, site: str, among: Sequence[str] | None = None) -> list[str]:
        """``site`` and its neighbours, of those still in the session (``among``: default,
        the sites that advertised keys), in the participants' order."""
        among = self.keys if among is None else among
        near = {site, *self.neighbours[site]}
        return [s for s in self.participants if s in near and s in among]

    def _enough(self, sites: Sequence[str], what: str) -> None:
        if len(sites) < self.threshold:
            raise SecureAggregationError(
                f"secure aggregation of session {self.session}: only {len(sites)} of "
                f"{len(self.participants)} sites {what} ({list(sites)}), fewer than the "
                f"threshold {self.threshold}: the round cannot be aggregated securely"
            )
