"""SecAgg+'s communication graph (Bell et al., CCS 2020): who masks with and shares with whom.

Each sampled site masks pairwise only with its k neighbours and shares its secrets only with
them, so a site's work and messages grow with k = O(log n) instead of n. The graph is a
Harary-style ring, as Flower's ``SecAggPlusWorkflow`` builds it: the sites in an order
shuffled by the session's graph seed, each joined to the k/2 before and after it (k even), so
it is k-regular and k-connected. The seed is a hash of a nonce from every site of the
session, each committed before any is revealed (``checks``), and every site rebuilds the
graph from it, so all hold the same one and no one, the server included, chose it. With
k ≥ n − 1 it is the full graph (plain SecAgg).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from fed_auc.privacy.secure.messages import SecureAggregationError


def neighbour_count(sites: int, requested: int | None = None) -> int:
    """k for ``sites`` sampled sites: ``requested`` (at most n − 1, the full graph), or
    2⌈log₂ n⌉ (SecAgg+'s O(log n); the full graph up to 7 sites)."""
    full = sites - 1
    if requested is None:
        return min(full, 2 * math.ceil(math.log2(max(sites, 2))))
    if isinstance(requested, bool) or not isinstance(requested, int):
        raise SecureAggregationError(
            f"secure_aggregation_neighbours must be an integer, got {requested!r}"
        )
    if requested >= full:
        return full
    if requested < 2 or requested % 2:
        raise SecureAggregationError(
            f"secure_aggregation_neighbours = {requested} for {sites} sites: the ring graph needs "
            f"an even number ≥ 2 of neighbours below the full graph ({full})"
        )
    return requested


def neighbourhoods(participants: Sequence[str], k: int, seed: bytes) -> dict[str, list[str]]:
    """Each site's k neighbours (in ``participants``' order, itself excluded)."""
    count = len(participants)
    if k >= count - 1:
        return {site: [s for s in participants if s != site] for site in participants}
    order = list(participants)
    random.Random(seed).shuffle(order)  # a layout from public randomness, not a secret
    half = k // 2
    near = {
        site: {order[(i + offset) % count] for offset in range(-half, half + 1)} - {site}
        for i, site in enumerate(order)
    }
    return {site: [s for s in participants if s in near[site]] for site in participants}


def components(sites: Sequence[str], graph: dict[str, list[str]]) -> list[list[str]]:
    """The connected groups of ``sites`` on ``graph`` restricted to them (each in ``sites``'
    order, the groups in the order of their first site). Unmasking the sum of survivors that
    fall into several groups reveals each group's sum: their pairwise masks cancel within a
    group and none join two groups."""
    inside = set(sites)
    seen: set[str] = set()
    groups = []
    for start in sites:
        if start in seen:
            continue
        seen.add(start)
        reached, frontier = {start}, [start]
        while frontier:
            frontier = [o for s in frontier for o in graph[s] if o in inside and o not in seen]
            seen.update(frontier)
            reached.update(frontier)
        groups.append([s for s in sites if s in reached])
    return groups
