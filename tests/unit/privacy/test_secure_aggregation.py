"""Secure aggregation's protocol: the server recovers the sum, never a term; SecAgg+'s sparse
graph of neighbours recovers the same sum and survives dropouts through the neighbours.

Every site's randomness is seeded (``random.Random(...).randbytes``) so each test sees the
same keys and masks on every run; the nodes use the operating system's generator.
"""

from __future__ import annotations

import base64
import random
import re

import numpy as np
import pytest
import torch
from scipy import stats

from fed_auc.coordinator.secure_phase import SecureAggregation, SecurePhase
from fed_auc.exchange import Broadcast, Reply, ReplyLayout
from fed_auc.privacy.secure import crypto
from fed_auc.privacy.secure.client import SecureClient
from fed_auc.privacy.secure.encoding import MASKED, PLAIN, WORDS, Entry, encode_reply
from fed_auc.privacy.secure.graph import neighbour_count, neighbourhoods
from fed_auc.privacy.secure.messages import CONFIG_KEY, SecureAggregationError, b64
from fed_auc.privacy.secure.server import SecureServer
from tests.support.secure_session import advertise


def clients(sites, seed=0):
    return {s: SecureClient(s, random.Random(f"{seed}:{s}").randbytes) for s in sites}


def run_session(
    vectors, threshold, lost_before_mask=(), lost_before_unmask=(), seed=0, neighbours=None
):
    """One full session in-process; returns (server, masked vectors seen, unmasked sum).
    ``neighbours``: k of SecAgg+'s graph (None: the full graph), laid out by a fixed seed."""
    sites = list(vectors)
    nodes = clients(sites, seed)
    server = SecureServer("run:1:train", sites, threshold, neighbours)
    advertise(server, nodes)
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
        SecureServer("run:1:train", ["a"], 1)
    with pytest.raises(SecureAggregationError, match="threshold must be in 2..3"):
        SecureServer("run:1:train", ["a", "b", "c"], 1)


def test_a_single_sites_masked_vector_is_uniform_over_the_field():
    """The server sees one site's vector only masked: for a payload as far from uniform as a
    model update gets (small values near 0 in fixed point), its words pass a KS test against
    U[0, 2^64) and a chi-square test on their top and bottom bytes, where the unmasked
    encoding fails both badly (the tests can tell)."""
    gen = np.random.default_rng(3)
    update = PLAIN.to_field(gen.normal(0, 1e-3, 20_000))  # words near 0 or near 2^64
    vectors = {s: update.copy() for s in SITES[:3]}
    _, masked, _ = run_session(vectors, threshold=2)
    seen = masked["b"]
    assert min(uniformity(seen)) > 0.01
    assert max(uniformity(update)[:2]) < 1e-12


def test_fp16s_32_bit_words_sum_exactly_and_one_sites_vector_is_uniform():
    """``--compress fp16``'s masked vectors: 32-bit words, summed exactly in Z_{2^32}; the
    coordinator's view of one site's vector passes the same tests against U[0, 2^32)."""
    fp16 = WORDS["fp16"]
    gen = np.random.default_rng(4)
    update = fp16.to_field(gen.normal(0, 1e-3, 20_000), gen)
    assert update.dtype == np.uint32
    vectors = {s: update.copy() for s in SITES[:3]}
    _, masked, total = run_session(vectors, threshold=2)
    assert masked["b"].dtype == np.uint32 and np.array_equal(total, update * np.uint32(3))
    assert min(uniformity(masked["b"])) > 0.01
    assert max(uniformity(update)[:2]) < 1e-12


def uniformity(words: np.ndarray) -> tuple[float, float, float]:
    """p-values of KS against U[0, 1) (the top 53 bits, or all 32) and chi-square on the top
    and bottom bytes of 64- or 32-bit words."""
    wide = words.astype(np.uint64) << np.uint64(64 - 8 * words.itemsize)  # bits on top
    unit = (wide >> np.uint64(11)).astype(np.float64) / 2.0**53
    ks = stats.kstest(unit, "uniform").pvalue
    top = np.bincount((wide >> np.uint64(56)).astype(np.int64), minlength=256)
    low = np.bincount((words & words.dtype.type(255)).astype(np.int64), minlength=256)
    return ks, stats.chisquare(top).pvalue, stats.chisquare(low).pvalue


def test_an_honest_site_never_reveals_both_secrets_of_one_site():
    vectors = random_vectors(SITES[:3])
    nodes = clients(SITES[:3])
    server = SecureServer("run:1:train", SITES[:3], 2)
    advertise(server, nodes)
    server.collect_shares({s: nodes[s].handle("share", m)
                           for s, m in server.share_requests().items()})  # fmt: skip
    for s in SITES[:3]:
        nodes[s].mask(vectors[s], server.mask_config(s))
    greedy = {"session": "run:1:train", "survivors": ["a", "b", "c", "c"]}
    with pytest.raises(SecureAggregationError, match="distinct"):
        nodes["a"].handle("unmask", greedy)
    answer = nodes["a"].handle("unmask", {"session": "run:1:train", "survivors": ["a", "b"]})
    assert set(answer["b_shares"]) == {"a", "b"} and set(answer["sk_shares"]) == {"c"}


def test_a_share_altered_on_the_way_fails_authentication():
    nodes = clients(SITES[:3])
    server = SecureServer("run:1:train", SITES[:3], 2)
    advertise(server, nodes)
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
    node.handle("advertise", {"session": "x:1:train", "participants": ["a", "b"],
                              "threshold": 2, "neighbours": 1, "weights": {"a": 1.0, "b": 1.0},
                              "unit": 1.0})  # fmt: skip
    with pytest.raises(SecureAggregationError, match="at 'advertised', expected 'masked'"):
        node.handle("unmask", {"session": "x:1:train", "survivors": []})


def test_fixed_point_encoding_is_within_its_bound_and_refuses_what_cannot_be_summed():
    values = torch.tensor([0.0, 1e-9, -3.25, 1234.5678, -1e5], dtype=torch.float64)
    layout = [Entry("w/x", (5,), torch.float64)]
    reply = Reply({"w/x": values}, steps=1, site="a")
    decoded = PLAIN.from_field(encode_reply(reply, layout, weight=1.0, participants=3))
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
    update = PLAIN.to_field(gen.normal(0, 1e-3, 20_000))  # far from uniform (see the full graph's)
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
    server = SecureServer("run:1:train", MANY, 2, 2)
    advertise(server, nodes)
    stranger = next(s for s in MANY if s != "s00" and s not in server.neighbours["s00"])
    message = server.share_requests()["s00"]
    keys = {s: [b64(c), b64(p)] for s, (c, p) in server.keys.items()}
    message["keys"][stranger] = keys[stranger]
    with pytest.raises(SecureAggregationError, match="not neighbours of this site"):
        nodes["s00"].handle("share", message)


# -- failing loudly: the range for every site summed, verified shares, no split graph ---------
class FlatBackend:
    """The least a backend gives a masked reply: its tensors as they are, one prefix."""

    def complete_reply(self, reply, broadcast):
        return reply

    def secure_layout(self, phase="train"):
        return ReplyLayout(prefixes=("",), buffers=False)

    def site_weight(self, num_examples):
        return 1.0


def masked_replies(sites, value, neighbours, threshold):
    """Each site's ``masked_reply`` of one tensor filled with ``value`` (weight 1), on
    SecAgg+'s graph: the masked vectors, or the error of each site that refused."""
    nodes = clients(sites)
    server = SecureServer("run:1:train", sites, threshold, neighbours)
    advertise(server, nodes)
    server.collect_shares({s: nodes[s].handle("share", m)
                           for s, m in server.share_requests().items()})  # fmt: skip
    masked, refused = {}, {}
    for site in sites:
        config = {**server.mask_config(site), "weight": 1.0, "excluded": []}
        broadcast = Broadcast(1, "train", {"w/x": torch.zeros(3)}, {CONFIG_KEY: config})
        reply = Reply({"w/x": torch.full((3,), value, dtype=torch.float64)}, steps=1, site=site)
        try:
            sent = nodes[site].masked_reply(reply, broadcast, FlatBackend())
        except ValueError as exc:
            refused[site] = str(exc)
            continue
        masked[site] = sent.tensors[MASKED].numpy().view("uint64")
    if len(masked) < threshold:
        return server, masked, refused, None
    answers = {s: nodes[s].handle("unmask", m)
               for s, m in server.unmask_requests(list(masked)).items()}  # fmt: skip
    return server, masked, refused, PLAIN.from_field(server.unmask(masked, answers))


SIXTEEN = [f"s{i:02d}" for i in range(16)]


def test_sixteen_sites_near_the_limit_on_a_k4_graph_refuse_by_name_never_a_wrong_sum():
    """The range is for the 16 sites summed, not a neighbourhood of k + 1 = 5: 3e8 fits five
    times in 2^31 but not sixteen (the old check let it through, and the sum wrapped around
    to 5.05e8 instead of 4.8e9); every site refuses before masking, naming itself and the
    limit 2^31 / 16. Just below that limit the sum is exact."""
    _, masked, refused, total = masked_replies(SIXTEEN, 3e8, neighbours=4, threshold=3)
    assert masked == {} and total is None
    assert sorted(refused) == SIXTEEN
    assert re.search(r"site 's07'.*'w/x' holds 3e\+08.*below 1\.34e\+08 \(2\^31 / 16 sites\)",
                     refused["s07"])  # fmt: skip
    limit = 2.0**31 / 16
    _, masked, refused, total = masked_replies(SIXTEEN, limit * 0.999, neighbours=4, threshold=3)
    assert refused == {} and len(masked) == 16
    assert total[:3] == pytest.approx([16 * limit * 0.999] * 3, rel=1e-12)
    assert total[3] == total[4] == 16.0  # the weights: per tensor and in all


def sealed_session(sites, threshold, neighbours=None):
    """A session up to the survivors' unmasking answers (every site masks and answers)."""
    vectors = random_vectors(sites, length=8)
    nodes = clients(sites)
    server = SecureServer("run:1:train", sites, threshold, neighbours)
    advertise(server, nodes)
    server.collect_shares({s: nodes[s].handle("share", m)
                           for s, m in server.share_requests().items()})  # fmt: skip
    masked = {s: nodes[s].mask(vectors[s], server.mask_config(s)) for s in sites}
    answers = {s: nodes[s].handle("unmask", m)
               for s, m in server.unmask_requests(sites).items()}  # fmt: skip
    return vectors, server, masked, answers


def flip_first_byte_of_chunk(text):
    raw = bytearray(base64.b64decode(text))
    raw[4] ^= 0x01  # the first byte after the share's index: a chunk of the secret
    return b64(bytes(raw))


def test_a_flipped_byte_in_one_seed_share_is_rejected_by_name_and_the_sum_stays_exact():
    """Before, the flipped share was combined: the seed came out wrong and the "sum" was
    noise, with no error. Now the share does not match the commitment its owner published:
    the site that sent it is named, none of its shares is used, and the other helpers'
    shares rebuild the exact sum; with too few left, the session fails naming it."""
    vectors, server, masked, answers = sealed_session(SITES, threshold=3)
    answers["a"]["b_shares"]["b"] = flip_first_byte_of_chunk(answers["a"]["b_shares"]["b"])
    total = server.unmask(masked, answers)
    assert np.array_equal(total, field_sum(vectors.values()))
    assert len(server.problems) == 1
    assert re.search(r"site 'a' sent a seed share of 'b' \(52 bytes\) that does not match the "
                     r"commitment 'b' published: rejected", server.problems[0])  # fmt: skip
    vectors, server, masked, answers = sealed_session(SITES[:3], threshold=3)
    answers["a"]["b_shares"]["b"] = flip_first_byte_of_chunk(answers["a"]["b_shares"]["b"])
    with pytest.raises(SecureAggregationError, match="2 of 3 surviving sites.*rejected: .*site "
                       "'a' sent a seed share of 'b'"):  # fmt: skip
        server.unmask(masked, answers)


@pytest.mark.parametrize(
    "malformed",
    [b64(b"abc"), b64(b"\xff" * 52), b64(b"\x00" * 200), "not base64!", 7],
    ids=["truncated", "garbage", "too long", "not base64", "not a string"],
)
def test_a_malformed_share_fails_the_session_with_a_named_secure_aggregation_error(malformed):
    """Before, a share of the wrong length reached the Shamir library and ended the run with
    its ValueError from deep inside (``max_workers must be greater than 0``)."""
    _, server, masked, answers = sealed_session(SITES[:3], threshold=3)
    answers["c"]["b_shares"]["a"] = malformed
    with pytest.raises(SecureAggregationError, match="fewer than the threshold 3.*rejected: .*"
                       "site 'c'.*seed share of 'a'"):  # fmt: skip
        server.unmask(masked, answers)


def test_a_relayed_share_that_is_not_the_committed_one_is_refused_by_its_holder():
    """The holder checks each decrypted share against its owner's commitment before masking,
    so a share that cannot be used later never enters a session silently."""
    nodes = clients(SITES[:3])
    server = SecureServer("run:1:train", SITES[:3], 2)
    advertise(server, nodes)
    server.collect_shares({s: nodes[s].handle("share", m)
                           for s, m in server.share_requests().items()})  # fmt: skip
    config = server.mask_config("a")
    config["commitments"]["b"] = config["commitments"]["b"][::-1]
    with pytest.raises(SecureAggregationError, match="the seed share from 'b' does not match"):
        nodes["a"].mask(np.zeros(4, dtype=np.uint64), config)


def ring_order(sites, seed):
    order = list(sites)
    random.Random(seed).shuffle(order)  # the layout ``neighbourhoods`` draws from the seed
    return order


def test_a_survivor_graph_split_by_dropouts_is_never_unmasked(monkeypatch):
    """On a k = 4 ring, two pairs of adjacent sites lost on opposite sides leave two arcs of
    survivors with no pairwise mask between them: unmasking would give the server each arc's
    sum. The server refuses before it asks for a share, and never combines a secret or
    removes a mask; one pair lost leaves one arc, which is recovered exactly."""
    vectors = random_vectors(MANY)
    order = ring_order(MANY, run_session(vectors, threshold=3, neighbours=4)[0].graph_seed)
    server, _, total = run_session(vectors, threshold=3, neighbours=4,
                                   lost_before_mask={order[0], order[1]})  # fmt: skip
    assert sorted(server.neighbours[order[2]]) == sorted([order[0], order[1], order[3], order[4]])
    assert np.array_equal(total, field_sum(v for s, v in vectors.items()
                                           if s not in {order[0], order[1]}))  # fmt: skip
    used = []
    monkeypatch.setattr(crypto, "combine_secret", lambda shares: used.append("combine"))
    monkeypatch.setattr(
        crypto, "mask", lambda seed, n, dtype: used.append("mask") or np.zeros(n, dtype)
    )
    lost = {order[0], order[1], order[6], order[7]}
    split = r"split the 8 surviving sites into 2 groups.*refusing to unmask"
    with pytest.raises(SecureAggregationError, match=split):
        run_session(vectors, threshold=3, neighbours=4, lost_before_mask=lost)
    nodes = clients(MANY)  # and the server's unmask itself refuses such survivors
    server = SecureServer("run:1:train", MANY, 3, 4)
    advertise(server, nodes)
    server.collect_shares({s: nodes[s].handle("share", m)
                           for s, m in server.share_requests().items()})  # fmt: skip
    masked = {s: vectors[s] for s in MANY if s not in lost}  # what it would hold
    used.clear()
    with pytest.raises(SecureAggregationError, match=split):
        server.unmask(masked, {})
    assert used == []


def test_a_sum_whose_total_weight_is_not_the_survivors_is_refused_not_decoded():
    """The last word of the sum is Σ π_k over the survivors, all public: a sum unmasked with
    a wrong seed (noise) fails that check and is refused by the coordinator."""
    sites = SITES[:3]
    total = masked_replies(sites, 0.25, neighbours=None, threshold=2)[3]
    phase = SecurePhase(SecureAggregation(), FlatBackend(), None,
                        {s: {"n": 10} for s in sites}, [], "run")  # fmt: skip
    phase._check_weight(PLAIN.to_field(total), sites, "run:1:train")  # the honest sum passes
    noisy = PLAIN.to_field(total) + crypto.mask(b"\x01" * 32, len(total))
    with pytest.raises(SecureAggregationError, match="total weight .* is not the survivors' 3"):
        phase._check_weight(noisy, sites, "run:1:train")
