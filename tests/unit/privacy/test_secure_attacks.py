"""Secure aggregation against a coordinator that asks cleverly (issue 36, item 4).

The coordinator is the attacker: it holds what a coordinator holds (its own code, the
registrations, every message the nodes answer) and asks only what the protocol lets it ask.
Each attack ran against main and got more than the sum; here every node it targets refuses,
by name. Whole runs go in-process (``simulate``) and through the Flower node path
(``NodeWorker`` behind ``FlowerLikeTransport``, the frames ``fed-auc node`` answers); the
protocol's own attacks (the graph seed, a split view) go against ``SecureClient`` directly.
"""

from __future__ import annotations

import copy
import random
import stat
from pathlib import Path

import numpy as np
import pytest

from fed_auc.coordinator.errors import FederationError
from fed_auc.coordinator.secure_phase import SecurePhase
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.privacy.secure import checks
from fed_auc.privacy.secure.client import SecureClient
from fed_auc.privacy.secure.messages import SecureAggregationError, b64
from fed_auc.privacy.secure.server import SecureServer
from fed_auc.simulation import resume_simulation, run_simulation
from fed_auc.store.records import RoundRecord
from fed_auc.store.run_store import RunStore
from tests.support.flower_like import _over_worker, _site_files
from tests.support.flower_like import _png_csv as png_csv
from tests.support.secure_session import advertise

SMALL = {
    "model": "tiny", "image_size": 16, "rounds": 1, "local_steps": 1, "batch_size": 8,
    "select": "last", "algorithm": "codasca", "secure_aggregation": True, "seed": 3,
}  # fmt: skip
UPDATE_DP = {"dp_clip": 1.0, "dp_noise": 0.5}
EXAMPLE_DP = {"dp": "example", "dp_clip": 1.0, "dp_noise": 2.0}
SPARSE = {"secure_aggregation_neighbours": 2}  # five sites on a ring: k = 2 < n − 1


# -- running a federation with an attacker for a coordinator -------------------------------
def _federation(tmp_path: Path, path: str, sites: int, options: dict) -> None:
    """One secure round, in-process or over the Flower node path (a refused round fails the
    run: ``FederationError`` is what an attacker that got nothing sees)."""
    options = {**SMALL, **options}
    try:
        if path == "in-process":
            config = ExperimentConfig(
                **options, sites=sites, data_scale=0.15, runs_dir=str(tmp_path / "sim")
            )
            run_simulation(config)
        else:
            names = ["north", "south", "east", "west", "centre"][:sites]
            specs = [(n, f"csv:{png_csv(tmp_path / n, ['label'], rows=36, seed=i)}")
                     for i, n in enumerate(names)]  # fmt: skip
            _over_worker(options, _site_files(tmp_path / "sites", specs, {}), tmp_path / "fl")
    except FederationError:
        pass


def _play(monkeypatch, attack) -> list:
    """Before the run's first secure phase, ``attack(run, phase, state, requests, rows,
    record, screen)`` plays the coordinator; it returns what the attack got, and the honest
    phase's result (None: the honest phase runs after it)."""
    original = SecurePhase.run
    got: list = []

    def run(self, state, requests, rows, record, screen, sent=None):
        if got:
            return original(self, state, requests, rows, record, screen, sent)
        outcome, result = attack(original, self, state, requests, rows, record, screen)
        got.append(outcome)
        return result or original(self, state, requests, rows, record, screen, sent)

    monkeypatch.setattr(SecurePhase, "run", run)
    return got


def _again(run, phase, state, requests, rows, screen) -> str | list[str]:
    """The secure phase over ``requests``, on copies of the round's rows and record:
    "answered" (the attacker got a sum), or every refusal the nodes sent and the error."""
    record = RoundRecord(round=-1)
    try:
        run(phase, state, requests, copy.deepcopy(rows), record, screen)
    except SecureAggregationError as exc:
        return [str(exc), *(f"{site}: {message}" for site, _, message in record.events)]
    return "answered"


def _refusals(outcome, text: str) -> set[str]:
    """The sites whose refusal names ``text``."""
    assert outcome != "answered", "the attack got a sum"
    return {line.split(":")[0] for line in outcome[1:] if text in line}


PATHS = ["in-process", "flower node path"]


# -- asked twice -----------------------------------------------------------------------------
def _ask_twice(run, phase, state, requests, rows, record, screen):
    """Round r over every site, then round r again without the first: on main the two sums
    differed by the first site's update exactly."""
    honest = run(phase, state, requests, rows, record, screen)
    first = next(iter(requests))
    rest = {site: b for site, b in requests.items() if site != first}
    return _again(run, phase, state, rest, rows, screen), honest


@pytest.mark.parametrize("path", PATHS)
def test_a_round_asked_again_over_fewer_sites_is_refused_by_every_site_asked(
    tmp_path, monkeypatch, path
):
    got = _play(monkeypatch, _ask_twice)
    _federation(tmp_path, path, 3, {})
    assert len(_refusals(got[0], "already masked")) == 2


@pytest.mark.parametrize("dp", [UPDATE_DP, EXAMPLE_DP], ids=["update DP", "DP-SGD"])
def test_a_round_asked_again_is_refused_under_both_dp_modes(tmp_path, monkeypatch, dp):
    """Refused, not answered with fresh noise: without DP no noise could make it safe, and
    the same refusal holds whatever the mode."""
    got = _play(monkeypatch, _ask_twice)
    _federation(tmp_path, "in-process", 3, dp)
    assert len(_refusals(got[0], "already masked")) == 2


def test_the_masked_rounds_survive_a_restart_in_a_private_file(tmp_path):
    """A node restarted (a new client on the same state directory) still refuses the round
    it masked; the ledger is readable by the node's user only."""
    path = tmp_path / checks.LEDGER_FILE
    sites = ["a", "b", "c"]
    nodes = {s: SecureClient(s, random.Random(s).randbytes,
                             ledger=checks.SessionLedger(path if s == "a" else None))
             for s in sites}  # fmt: skip
    server = SecureServer("run:4:train", sites, 2)
    advertise(server, nodes)
    server.collect_shares({s: nodes[s].handle("share", m)
                           for s, m in server.share_requests().items()})  # fmt: skip
    nodes["a"].mask(np.zeros(4, dtype=np.uint64), server.mask_config("a"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    restarted = SecureClient("a", ledger=checks.SessionLedger(path))
    retry = SecureServer("run:4:train#retry", sites, 2).advertise_requests()["a"]
    for name in ("run:4:train", "other-run:4:train"):
        with pytest.raises(SecureAggregationError, match="round 4 phase 'train' was already"):
            restarted.handle("advertise", {**retry, "session": name})
    restarted.handle("advertise", {**retry, "session": "run:5:train"})  # the next round opens
    with pytest.raises(SecureAggregationError, match="not named run:round:phase"):
        restarted.handle("advertise", {**retry, "session": "round-four"})


def test_a_coordinator_that_aborts_to_draw_another_graph_gets_few_draws(tmp_path):
    """Each session of a round draws a new graph: after ``SESSIONS_PER_ROUND`` of them, even
    across a restart, the node opens no more for that round."""
    path = tmp_path / checks.LEDGER_FILE
    message = SecureServer("run:5:train", ["a", "b", "c"], 2).advertise_requests()["a"]
    for _ in range(checks.SESSIONS_PER_ROUND):
        SecureClient("a", ledger=checks.SessionLedger(path)).handle("advertise", message)
    restarted = SecureClient("a", ledger=checks.SessionLedger(path))
    with pytest.raises(SecureAggregationError, match="already had 4 secure sessions"):
        restarted.handle("advertise", message)
    restarted.handle("advertise", {**message, "session": "run:5:collect"})  # another phase


# -- weights ---------------------------------------------------------------------------------
def _weighted(choose):
    def attack(run, phase, state, requests, rows, record, screen):
        honest = phase.weights
        phase.weights = {**honest, **choose(list(requests))}
        try:
            return _again(run, phase, state, requests, rows, screen), None
        finally:
            phase.weights = honest

    return attack


ONE_SITE = _weighted(lambda sites: {s: float(s == sites[0]) for s in sites})
NEAR_ZERO = _weighted(lambda sites: {s: 1.0 if s == sites[0] else 2.0**-16 for s in sites})


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("attack", "refusal"),
    [(ONE_SITE, "outside [2^-16, 1]"), (NEAR_ZERO, "not the")],
    ids=["(1, 0, 0)", "(1, 2^-16, 2^-16)"],
)
def test_weights_that_make_the_sum_one_sites_value_are_refused(
    tmp_path, monkeypatch, path, attack, refusal
):
    got = _play(monkeypatch, attack)
    _federation(tmp_path, path, 3, {})
    assert len(_refusals(got[0], refusal)) >= 2  # every site but the one singled out


# -- lying about who dropped -----------------------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
def test_a_coordinator_that_says_two_sites_dropped_to_split_the_ring_gets_no_share(
    tmp_path, monkeypatch, path
):
    """Five sites on a k = 2 ring, every vector in: the coordinator skips its own check and
    says two non-adjacent sites dropped, which would leave two arcs, each unmasked alone."""
    original = SecureServer.unmask_requests
    records: list[RoundRecord] = []
    spy = SecurePhase.run

    def keep(self, state, requests, rows, record, screen, sent=None):
        records.append(record)
        return spy(self, state, requests, rows, record, screen, sent)

    def lying(self, survivors):
        first = survivors[0]
        far = next(s for s in survivors if s != first and s not in self.neighbours[first])
        self._connected = lambda sites: None  # its own code: the check is skipped
        return original(self, [s for s in survivors if s not in (first, far)])

    monkeypatch.setattr(SecurePhase, "run", keep)
    monkeypatch.setattr(SecureServer, "unmask_requests", lying)
    _federation(tmp_path, path, 5, SPARSE)
    refused = [m for _, _, m in records[0].events if "unmask" in m and "groups" in m]
    assert len(refused) == 3  # every site asked


def test_a_split_survivor_list_is_refused_by_the_node_before_any_share():
    sites = [f"s{i}" for i in range(8)]
    nodes = {s: SecureClient(s, random.Random(s).randbytes) for s in sites}
    server = SecureServer("run:1:train", sites, 2, 2)
    advertise(server, nodes)
    server.collect_shares({s: nodes[s].handle("share", m)
                           for s, m in server.share_requests().items()})  # fmt: skip
    for s in sites:
        nodes[s].mask(np.zeros(4, dtype=np.uint64), server.mask_config(s))
    first = sites[0]
    far = next(s for s in sites[1:] if s not in server.neighbours[first])
    told = [s for s in sites if s not in (first, far)]
    for site in told:
        with pytest.raises(SecureAggregationError, match="groups on the session's graph"):
            nodes[site].handle("unmask", {"session": "run:1:train", "survivors": told})


# -- the graph seed --------------------------------------------------------------------------
def _advertised(sites, seed=0):
    nodes = {s: SecureClient(s, random.Random(f"{seed}:{s}").randbytes) for s in sites}
    server = SecureServer("run:1:train", sites, 3, 2)
    server.collect_keys({s: nodes[s].handle("advertise", m)
                         for s, m in server.advertise_requests().items()})  # fmt: skip
    return nodes, server


def test_the_graph_seed_is_one_every_site_helped_draw():
    """A seed sent by the coordinator is ignored; a reveal swapped for a chosen nonce, or left
    out, is refused by every site; an honest draw gives every site the server's graph."""
    sites = [f"s{i}" for i in range(8)]
    nodes, server = _advertised(sites)
    chosen = {**server.reveal_requests()["s0"], "graph_seed": b64(b"chosen")}
    reveals = {s: nodes[s].handle("reveal", chosen) for s in sites}
    server.collect_reveals(reveals)
    share = server.share_requests()
    for s in sites:
        swapped = {**share[s], "reveals": {**share[s]["reveals"], "s1": b64(b"\x01" * 32)}}
        with pytest.raises(SecureAggregationError, match="'s1' does not match its commitment"):
            nodes[s].handle("share", swapped)
        left_out = {k: v for k, v in share[s]["reveals"].items() if k != "s7"}
        with pytest.raises(SecureAggregationError, match="not every member helped draw"):
            nodes[s].handle("share", {**share[s], "reveals": left_out})
    nodes, server = _advertised(sites)  # the same keys and nonces, honestly relayed
    server.collect_reveals({s: nodes[s].handle("reveal", m)
                            for s, m in server.reveal_requests().items()})  # fmt: skip
    for s, message in server.share_requests().items():
        nodes[s].handle("share", message)
        assert sorted(nodes[s]._session.neighbours) == sorted(server.neighbours[s])


def test_a_coordinator_cannot_relay_another_commitment_as_a_sites_own():
    nodes, server = _advertised([f"s{i}" for i in range(5)])
    request = server.reveal_requests()["s0"]
    forged = {**request["commitments"], "s0": request["commitments"]["s1"]}
    with pytest.raises(SecureAggregationError, match="another commitment as ours"):
        nodes["s0"].handle("reveal", {**request, "commitments": forged})


# -- what a share is bound to ----------------------------------------------------------------
def test_sites_told_different_weights_cannot_open_each_others_shares():
    """The coordinator tells site c another unit (and weights that pass c's own check): c's
    shares and a's and b's are bound to different contexts, so none opens."""
    sites = ["a", "b", "c"]
    nodes = {s: SecureClient(s, random.Random(s).randbytes) for s in sites}
    server = SecureServer("run:1:train", sites, 2)
    requests = server.advertise_requests()
    lied = {**requests["c"], "unit": 2.0, "weights": dict.fromkeys(sites, 0.5)}
    nodes["c"] = SecureClient("c", random.Random("c").randbytes, owed_weight=1.0)
    answers = {s: nodes[s].handle("advertise", lied if s == "c" else m)
               for s, m in requests.items()}  # fmt: skip
    server.collect_keys(answers)
    server.collect_reveals({s: nodes[s].handle("reveal", m)
                            for s, m in server.reveal_requests().items()})  # fmt: skip
    server.collect_shares({s: nodes[s].handle("share", m)
                           for s, m in server.share_requests().items()})  # fmt: skip
    with pytest.raises(SecureAggregationError, match="from 'c' fails authentication"):
        nodes["a"].mask(np.zeros(4, dtype=np.uint64), server.mask_config("a"))
    with pytest.raises(SecureAggregationError, match="fails authentication"):
        nodes["c"].mask(np.zeros(4, dtype=np.uint64), server.mask_config("c"))


def test_a_resumed_run_does_not_ask_a_round_its_sites_already_masked(tmp_path, monkeypatch):
    """The coordinator stops after the sites masked round 2 and before it unmasked it; the
    resumed run asks round 2 again and the sites, rebuilt on their state directories, refuse
    it by name: the round fails rather than give a second sum."""
    original = SecureServer.unmask_requests

    def crash(self, survivors):
        if self.session.endswith(":1:train"):
            raise RuntimeError("the coordinator stopped")
        return original(self, survivors)

    monkeypatch.setattr(SecureServer, "unmask_requests", crash)
    runs = tmp_path / "sim"
    config = ExperimentConfig(**{**SMALL, "rounds": 2}, sites=3, data_scale=0.15,
                              runs_dir=str(runs))  # fmt: skip
    with pytest.raises(RuntimeError, match="the coordinator stopped"):
        run_simulation(config)
    with RunStore(runs) as store:
        run_id = store.runs().iloc[0]["id"]
    monkeypatch.setattr(SecureServer, "unmask_requests", original)
    with pytest.raises(FederationError, match="advertised keys"):
        resume_simulation(runs, run_id)
    with RunStore(runs) as store:
        events = store.events(run_id)["message"]
    assert events.str.contains("round 1 phase 'train' was already masked").sum() == 3
