"""Secure aggregation's protocol: the server recovers the sum, never a term; SecAgg+'s sparse
graph of neighbours recovers the same sum and survives dropouts through the neighbours.

Every site's randomness is seeded (``random.Random(...).randbytes``) so each test sees the
same keys and masks on every run; the nodes use the operating system's generator.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from scipy import stats

from fed_auc.algorithms.base import Reply
from fed_auc.secure_aggregation.client import SecureClient
from fed_auc.secure_aggregation.encoding import Entry, encode_reply, from_field, to_field
from fed_auc.secure_aggregation.graph import neighbour_count, neighbourhoods
from fed_auc.secure_aggregation.messages import SecureAggregationError, b64
from fed_auc.secure_aggregation.server import SecureServer


def clients(sites, seed=0):
    return {s: SecureClient(s, random.Random(f"{seed}:{s}").randbytes) for s in sites}


def run_session(
    vectors, threshold, lost_before_mask=(), lost_before_unmask=(), seed=0, neighbours=None
):
    """One full session in-process; returns (server, masked vectors seen, unmasked sum).
    ``neighbours``: k of SecAgg+'s graph (None: the full graph), laid out by a fixed seed."""
    sites = list(vectors)
    nodes = clients(sites, seed)
    server = SecureServer("run:1:train", sites, threshold, neighbours, f"graph:{seed}".encode())
    server.collect_keys({s: nodes[s].handle("advertise", m)
                         for s, m in server.advertise_requests().items()})  # fmt: skip
    server.collect_shares({s: nodes[s].handle("share", m)
                           for s, m in server.share_requests().items()})  # fmt: skip
    masked = {
        s: nodes[s].mask(vectors[s], server.mask_config(s))
        for s in server.sharers
        if s not in lost_before_mask
    }
    requests = server.unmask_requests(list(masked))
    answers = {s: nodes[s].handle("unmask", m) for s, m in requests.items()
               if s not in lost_before_unmask}  # fmt: skip
    return server, masked, server.unmask(masked, answers)


def random_vectors(sites, length=1000, seed=1):
    gen = np.random.default_rng(seed)
    return {s: gen.integers(0, 2**64, length, dtype=np.uint64) for s in sites}


def field_sum(vectors):
    vectors = list(vectors)
    total = np.zeros_like(vectors[0])
    for v in vectors:
        total += v  # uint64 additions wrap: the sum in Z_{2^64}
    return total


SITES = ["a", "b", "c", "d", "e"]


def test_the_unmasked_sum_equals_the_sum_of_the_vectors_exactly():
    vectors = random_vectors(SITES)
    _, masked, total = run_session(vectors, threshold=3)
    assert np.array_equal(total, field_sum(vectors.values()))
    for site in SITES:  # no masked vector is the site's own
        assert not np.array_equal(masked[site], vectors[site])


def test_a_site_that_drops_after_sharing_keys_leaves_the_sum_of_the_others():
    vectors = random_vectors(SITES)
    server, masked, total = run_session(vectors, threshold=3, lost_before_mask={"c"})
    assert sorted(masked) == ["a", "b", "d", "e"]
    assert np.array_equal(total, field_sum(v for s, v in vectors.items() if s != "c"))


def test_two_sites_lost_one_before_masking_one_before_unmasking():
    vectors = random_vectors(SITES)
    _, masked, total = run_session(
        vectors, threshold=3, lost_before_mask={"a"}, lost_before_unmask={"e"}
    )
    # e's vector arrived, so it is in the sum; the survivors' shares rebuild its seed
    assert np.array_equal(total, field_sum(v for s, v in vectors.items() if s != "a"))


def test_below_the_threshold_of_masked_vectors_the_session_fails_by_name():
    vectors = random_vectors(SITES)
    with pytest.raises(SecureAggregationError, match="fewer than the threshold 4"):
        run_session(vectors, threshold=4, lost_before_mask={"a", "b"})


def test_below_the_threshold_of_unmasking_shares_the_session_fails_by_name():
    vectors = random_vectors(SITES)
    with pytest.raises(SecureAggregationError, match="2 of 5 surviving sites.*threshold 3"):
        run_session(vectors, threshold=3, lost_before_unmask={"a", "b", "c"})


def test_one_site_alone_is_never_aggregated_securely():
    with pytest.raises(SecureAggregationError, match="at least 2 sites"):
        SecureServer("s", ["a"], 1)
    with pytest.raises(SecureAggregationError, match="threshold must be in 2..3"):
        SecureServer("s", ["a", "b", "c"], 1)


def test_a_single_sites_masked_vector_is_uniform_over_the_field():
    """The server sees one site's vector only masked: for a payload as far from uniform as a
    model update gets (small values near 0 in fixed point), its words pass a KS test against
    U[0, 2^64) and a chi-square test on their top and bottom bytes, where the unmasked
    encoding fails both badly (the tests can tell)."""
    gen = np.random.default_rng(3)
    update = to_field(gen.normal(0, 1e-3, 20_000))  # words near 0 or near 2^64
    vectors = {s: update.copy() for s in SITES[:3]}
    _, masked, _ = run_session(vectors, threshold=2)
    seen = masked["b"]
    assert min(uniformity(seen)) > 0.01
    assert max(uniformity(update)[:2]) < 1e-12


def uniformity(words: np.ndarray) -> tuple[float, float, float]:
    """p-values of KS against U[0, 1) (the top 53 bits) and chi-square on the top and bottom
    bytes."""
    unit = (words >> np.uint64(11)).astype(np.float64) / 2.0**53
    ks = stats.kstest(unit, "uniform").pvalue
    top = np.bincount((words >> np.uint64(56)).astype(np.int64), minlength=256)
    low = np.bincount((words & np.uint64(255)).astype(np.int64), minlength=256)
    return ks, stats.chisquare(top).pvalue, stats.chisquare(low).pvalue


def test_an_honest_site_never_reveals_both_secrets_of_one_site():
    vectors = random_vectors(SITES[:3])
    nodes = clients(SITES[:3])
    server = SecureServer("s", SITES[:3], 2)
    server.collect_keys({s: nodes[s].handle("advertise", m)
                         for s, m in server.advertise_requests().items()})  # fmt: skip
    server.collect_shares({s: nodes[s].handle("share", m)
                           for s, m in server.share_requests().items()})  # fmt: skip
    for s in SITES[:3]:
        nodes[s].mask(vectors[s], server.mask_config(s))
    greedy = {"session": "s", "survivors": ["a", "b", "c"], "dropped": ["c"]}
    with pytest.raises(SecureAggregationError, match="disjoint"):
        nodes["a"].handle("unmask", greedy)


def test_a_share_altered_on_the_way_fails_authentication():
    nodes = clients(SITES[:3])
    server = SecureServer("s", SITES[:3], 2)
    server.collect_keys({s: nodes[s].handle("advertise", m)
                         for s, m in server.advertise_requests().items()})  # fmt: skip
    server.collect_shares({s: nodes[s].handle("share", m)
                           for s, m in server.share_requests().items()})  # fmt: skip
    config = server.mask_config("a")
    config["shares"]["b"] = config["shares"]["c"]  # c's share to a, relabelled as b's
    with pytest.raises(SecureAggregationError, match="from 'b' fails authentication"):
        nodes["a"].mask(np.zeros(4, dtype=np.uint64), config)


def test_a_step_out_of_order_or_of_another_session_is_refused():
    node = clients(["a"])["a"]
    with pytest.raises(SecureAggregationError, match="no open session"):
        node.handle("share", {"session": "x", "keys": {}})
    node.handle("advertise", {"session": "x", "participants": ["a", "b"], "threshold": 2,
                              "neighbours": 1, "graph_seed": b64(b"graph")})  # fmt: skip
    with pytest.raises(SecureAggregationError, match="at 'advertised', expected 'masked'"):
        node.handle("unmask", {"session": "x", "survivors": [], "dropped": []})


def test_fixed_point_encoding_is_within_its_bound_and_refuses_what_cannot_be_summed():
    values = torch.tensor([0.0, 1e-9, -3.25, 1234.5678, -1e5], dtype=torch.float64)
    layout = [Entry("w/x", (5,), torch.float64)]
    reply = Reply({"w/x": values}, steps=1, site="a")
    decoded = from_field(encode_reply(reply, layout, weight=1.0, participants=3))
    assert np.max(np.abs(decoded[:5] - values.numpy())) <= 2.0**-33
    assert decoded[5] == 1.0 and decoded[6] == 1.0  # the site's weight, per tensor and total
    too_big = Reply({"w/x": torch.full((5,), 1e9, dtype=torch.float64)}, steps=1, site="a")
    with pytest.raises(ValueError, match="'w/x' holds 1e\\+09.*2\\^31 / 3 sites"):
        encode_reply(too_big, layout, 1.0, 3)
    nan = Reply({"w/x": torch.tensor([0, 0, float("nan"), 0, 0.0])}, steps=1, site="a")
    with pytest.raises(ValueError, match="site 'a'.*'w/x' holds nan"):
        encode_reply(nan, layout, 1.0, 3)


# -- SecAgg+: a k-regular graph of neighbours --------------------------------------------------
MANY = [f"s{i:02d}" for i in range(12)]


def test_the_graph_is_k_regular_symmetric_connected_and_the_same_from_the_same_seed():
    assert [neighbour_count(n) for n in (2, 3, 7, 8, 12, 100)] == [1, 2, 6, 6, 8, 14]
    for n, k in [(8, 6), (12, 4), (30, 10), (12, 2)]:
        sites = MANY[:n] if n <= 12 else [f"x{i}" for i in range(n)]
        graph = neighbourhoods(sites, k, b"seed")
        assert all(len(near) == k and site not in near for site, near in graph.items())
        assert all(site in graph[other] for site, near in graph.items() for other in near)
        reached, frontier = {sites[0]}, [sites[0]]
        while frontier:
            frontier = [o for s in frontier for o in graph[s] if o not in reached]
            reached.update(frontier)
        assert reached == set(sites)
        assert neighbourhoods(sites, k, b"seed") == graph != neighbourhoods(sites, k, b"other")
    assert neighbourhoods(SITES, 4, b"seed") == {s: [o for o in SITES if o != s] for s in SITES}
    with pytest.raises(SecureAggregationError, match="even number ≥ 2 of neighbours"):
        neighbour_count(12, 3)


def test_on_a_sparse_graph_sites_share_and_mask_only_with_their_neighbours_and_sum_exactly():
    vectors = random_vectors(MANY)
    server, masked, total = run_session(vectors, threshold=3, neighbours=4)
    assert np.array_equal(total, field_sum(vectors.values()))
    for site in MANY:
        assert sorted(server.share_requests()[site]["keys"]) == sorted(
            [site, *server.neighbours[site]]
        )
        assert sorted(server.mask_config(site)["shares"]) == sorted(server.neighbours[site])
        assert len(server.neighbours[site]) == 4


def test_a_sparse_sites_masked_vector_is_uniform_over_the_field():
    gen = np.random.default_rng(3)
    update = to_field(gen.normal(0, 1e-3, 20_000))  # far from uniform (see the full graph's)
    _, masked, _ = run_session({s: update.copy() for s in MANY}, threshold=2, neighbours=2)
    assert max(uniformity(update)[:2]) < 1e-12
    assert min(uniformity(masked["s07"])) > 0.01


def test_a_dropped_site_is_recovered_through_its_neighbours():
    vectors = random_vectors(MANY)
    lost = "s03"
    server = run_session(vectors, threshold=3, neighbours=4)[0]
    helper = server.neighbours[lost][0]  # one of its neighbours is lost too, before unmasking
    _, masked, total = run_session(
        vectors, threshold=3, neighbours=4, lost_before_mask={lost}, lost_before_unmask={helper}
    )
    assert lost not in masked and helper in masked
    assert np.array_equal(total, field_sum(v for s, v in vectors.items() if s != lost))


def test_below_the_threshold_among_a_dropped_sites_neighbours_the_session_fails_by_name():
    vectors = random_vectors(MANY)
    lost = "s03"
    server = run_session(vectors, threshold=3, neighbours=4)[0]
    gone = set(server.neighbours[lost][:3])  # only one of its four neighbours answers
    with pytest.raises(SecureAggregationError, match="dropped site 's03'.*threshold 3"):
        run_session(vectors, threshold=3, neighbours=4, lost_before_mask={lost},
                    lost_before_unmask=gone)  # fmt: skip


def test_the_server_cannot_make_a_site_share_with_a_non_neighbour():
    nodes = clients(MANY)
    server = SecureServer("s", MANY, 2, 2, b"seed")
    server.collect_keys({s: nodes[s].handle("advertise", m)
                         for s, m in server.advertise_requests().items()})  # fmt: skip
    stranger = next(s for s in MANY if s != "s00" and s not in server.neighbours["s00"])
    message = server.share_requests()["s00"]
    keys = {s: [b64(c), b64(p)] for s, (c, p) in server.keys.items()}
    message["keys"][stranger] = keys[stranger]
    with pytest.raises(SecureAggregationError, match="not neighbours of this site"):
        nodes["s00"].handle("share", message)
