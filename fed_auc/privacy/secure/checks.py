"""What a node checks before anything of its own leaves a secure session, against a
coordinator that asks cleverly (issue 36): it may learn one sum per round and phase, no more.

- One session per round and phase (``SessionLedger``): asked again for a round it already
  masked a vector in, over fewer sites, a node would let the two sums differ by one site's
  update. It refuses instead of answering with fresh noise: refusing is the only answer that
  also holds without DP. The ledger is a file in the node's state directory, so a restart
  does not reset it.
- Its weight (``check_weights``): the weights are sent at advertise, each node checks its own
  is the one it is owed (its registered n as the coordinator weighs it), and none is below
  ``WEIGHT_FLOOR``, so (1, 0, 0, 0) cannot turn the sum into one site's value.
- The graph seed (``nonce_commitment``, ``graph_seed``): a hash of every member's revealed
  nonce, each committed before any was revealed, so no one chooses the layout alone; a
  coordinator that aborts sessions to draw again gets ``SESSIONS_PER_ROUND`` draws at most.
- Survivors (``check_survivors``): the same survivor list for the whole session, which must
  keep the graph connected, or a split ring gives each group's sum.
- Context (``context_digest``): what the node was told, bound into each share's associated
  data, so neighbours told different things (weights, members, seed) cannot open each
  other's shares.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fed_auc.io import save_json
from fed_auc.privacy.secure import crypto
from fed_auc.privacy.secure.graph import components
from fed_auc.privacy.secure.messages import SecureAggregationError

LEDGER_FILE = "secure_sessions.json"
WEIGHT_FLOOR = 2.0**-16  # the smallest share π_k = w_k / unit a node accepts for any site
NONCE_BYTES = 32
SESSIONS_PER_ROUND = 4  # sessions a node opens for one round and phase (a resume, a retry)


class SessionLedger:
    """The rounds and phases this node has sent a masked vector in, kept in ``path`` (written
    atomically, readable by the node's user only; None: in memory, for protocol tests)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._masked: dict[str, str] = {}  # "round:phase" → the session that masked it
        self._opened: dict[str, int] = {}  # "round:phase" → sessions opened for it
        if path is not None and path.exists():
            try:
                loaded = json.loads(path.read_text())
                self._masked = dict(loaded["masked"])
                self._opened = {k: int(v) for k, v in loaded["opened"].items()}
            except (ValueError, KeyError, TypeError):
                raise SecureAggregationError(
                    f"secure session ledger {path} is unreadable: refusing every secure session "
                    "rather than forget which rounds were masked (restore or inspect it)"
                ) from None

    @staticmethod
    def round_phase(session: str, where: str) -> tuple[int, str]:
        """The round and phase a session's name ``run:round:phase`` binds."""
        parts = session.rsplit(":", 2)
        if len(parts) != 3 or not parts[0] or not parts[1].isdigit() or not parts[2]:
            raise SecureAggregationError(
                f"{where}: session {session!r} is not named run:round:phase"
            )
        return int(parts[1]), parts[2]

    def check_open(self, session: str, where: str) -> None:
        """Refuse a session for a round and phase this node already masked a vector in."""
        round_, phase = self.round_phase(session, where)
        earlier = self._masked.get(f"{round_}:{phase}")
        if earlier is not None:
            raise SecureAggregationError(
                f"{where}: round {round_} phase {phase!r} was already masked in session "
                f"{earlier!r}; refusing session {session!r} (a second sum of the same round "
                "over other sites would reveal the difference)"
            )

    def open(self, session: str, where: str) -> None:
        """Count a new session for its round, refused once the round was masked or had its
        ``SESSIONS_PER_ROUND`` (each draws a new graph: no coordinator draws until it likes
        one)."""
        self.check_open(session, where)
        round_, phase = self.round_phase(session, where)
        opened = self._opened.get(f"{round_}:{phase}", 0)
        if opened >= SESSIONS_PER_ROUND:
            raise SecureAggregationError(
                f"{where}: round {round_} phase {phase!r} already had {opened} secure sessions, "
                f"the most a node opens for one round: refusing session {session!r}"
            )
        self._opened[f"{round_}:{phase}"] = opened + 1
        self._save()

    def record(self, session: str, where: str) -> None:
        """Note ``session``'s round as masked, on disk before the masked vector leaves."""
        self.check_open(session, where)
        round_, phase = self.round_phase(session, where)
        self._masked[f"{round_}:{phase}"] = session
        self._save()

    def _save(self) -> None:
        if self.path is not None:
            save_json({"masked": self._masked, "opened": self._opened}, self.path)


def check_weights(
    site: str, participants: Sequence[str], message: Mapping[str, Any], owed: float, where: str
) -> float:
    """This site's weight π, if the advertised weights give every participant one within
    [WEIGHT_FLOOR, 1] and this site the one it is owed (``owed``: its w_k, over the unit)."""
    weights, unit = message.get("weights"), message.get("unit")
    if not isinstance(weights, Mapping) or set(weights) != set(participants):
        raise SecureAggregationError(f"{where}: the weights must name exactly the participants")
    if isinstance(unit, bool) or not isinstance(unit, int | float) or not unit > 0:
        raise SecureAggregationError(f"{where}: the unit {unit!r} must be a positive number")
    for name, value in weights.items():
        good = isinstance(value, int | float) and not isinstance(value, bool)
        if not good or not WEIGHT_FLOOR <= value <= 1:
            raise SecureAggregationError(
                f"{where}: weight {value!r} of site {name!r} is outside [2^-16, 1]: refusing "
                "(a sum weighted so is one site's value)"
            )
    expected = owed / unit
    if not math.isclose(weights[site], expected, rel_tol=1e-9):
        raise SecureAggregationError(
            f"{where}: this site is given weight {weights[site]!r}, not the {expected!r} it is "
            f"owed (w = {owed!r} over the unit {unit!r}): refusing"
        )
    return float(weights[site])


def nonce_commitment(session: str, site: str, nonce: bytes) -> bytes:
    """What ``site`` publishes at advertise for its share of the graph seed."""
    return crypto.commitment(session, site, "graph nonce", nonce)


def graph_seed(session: str, members: Sequence[str], reveals: Mapping[str, bytes]) -> bytes:
    """The session's graph seed: a hash of every member's revealed nonce, in members' order."""
    return crypto.commitment(session, "graph seed", *[p for s in members for p in (s, reveals[s])])


def check_reveals(
    session: str,
    commitments: Mapping[str, bytes],
    reveals: Mapping[str, bytes],
    where: str,
) -> None:
    """Every member that committed revealed the nonce it committed to, and only they did."""
    if set(reveals) != set(commitments):
        raise SecureAggregationError(
            f"{where}: nonces revealed by {sorted(reveals)}, committed by {sorted(commitments)}: "
            "refusing a graph seed that not every member helped draw"
        )
    for site, nonce in reveals.items():
        if len(nonce) != NONCE_BYTES or nonce_commitment(session, site, nonce) != commitments[site]:
            raise SecureAggregationError(
                f"{where}: the graph nonce of {site!r} does not match its commitment: refusing"
            )


def context_digest(advertised: Mapping[str, Any], members: Sequence[str], seed: bytes) -> bytes:
    """What this node was told of the session (participants, threshold, k, weights, unit, the
    members and the graph seed): bound into every share's associated data."""
    told = {k: advertised[k] for k in ("participants", "threshold", "neighbours", "weights")}
    text = json.dumps({**told, "unit": advertised["unit"], "members": list(members)},
                      sort_keys=True)  # fmt: skip
    return crypto.commitment(advertised["session"], text, seed)


def check_survivors(
    site: str,
    survivors: Any,
    members: Sequence[str],
    graph: Mapping[str, list[str]],
    threshold: int,
    where: str,
) -> list[str]:
    """The survivors of the whole session, if they are members, include this site, reach the
    threshold and stay connected on the session's graph; refused otherwise."""
    if not isinstance(survivors, list) or len(set(survivors)) != len(survivors):
        raise SecureAggregationError(f"{where}: survivors must be a list of distinct sites")
    if not set(survivors) <= set(members) or site not in survivors:
        raise SecureAggregationError(
            f"{where}: survivors {survivors} are not members of the session including this site"
        )
    if len(survivors) < threshold:
        raise SecureAggregationError(
            f"{where}: {len(survivors)} survivors, fewer than the threshold {threshold}"
        )
    groups = components([s for s in members if s in survivors], dict(graph))
    if len(groups) > 1:
        raise SecureAggregationError(
            f"{where}: the survivors fall into {len(groups)} groups on the session's graph "
            f"({groups}); unmasking would reveal each group's sum: refusing"
        )
    return list(survivors)
