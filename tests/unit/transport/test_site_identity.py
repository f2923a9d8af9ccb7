"""A site name is bound to its node key: a second node with another valid key that says it is
an already joined site is refused, logged as an impersonation attempt, and never takes the
site's place (issue 36, item 5).

The attacker here holds what such a node holds: a key the coordinator registered (another
site's, or a spare one) and the freedom to say any site name when it registers. The grid
below answers as Flower's SuperLink does under node authentication: a node's id is the one
registered for its key, so the transport sees the claim and the node id it came from.
"""

from __future__ import annotations

import shutil
import subprocess
from types import SimpleNamespace

import pytest
from flwr.supercore.task_identity import TaskIdentity

from fed_auc.experiment.files import FlowerSettings, recorded_config
from fed_auc.node.setup import NodeSetup
from fed_auc.transport.flower.certs import make_certs
from fed_auc.transport.flower.client import frame_content, message_frame
from fed_auc.transport.flower.identity import SiteIdentities, fingerprint, read_site_keys
from fed_auc.transport.flower.transport import FlowerTransport

NORTH, SOUTH, SPARE = 101, 202, 303  # Flower node ids of the registered keys


class NodesLike:
    """Flower nodes behind a grid: ``claims`` says which site each node id answers as."""

    def __init__(self, claims: dict[int, str]) -> None:
        self.claims = dict(claims)
        self.asked: list[tuple[int, str]] = []  # (node, message type) of every request

    def get_node_ids(self) -> list[int]:
        return list(self.claims)

    def push_messages(self, messages) -> list[str]:
        self.pending = {f"m{m.metadata.dst_node_id}": m for m in messages}
        self.asked += [(m.metadata.dst_node_id, m.metadata.message_type) for m in messages]
        return list(self.pending)

    def pull_messages(self, message_ids) -> list[SimpleNamespace]:
        replies = []
        for mid in [m for m in self.pending if m in message_ids]:  # in the order pushed
            node = self.pending[mid].metadata.dst_node_id
            header, _ = message_frame(self.pending[mid].content)
            if header["kind"] == "register":
                site = self.claims[node]
                answer = {"site": site, "registration": {"order": node}, "summary": {}}
            else:
                answer = {"kind": header["kind"], "node": node}
            replies.append(
                SimpleNamespace(
                    metadata=SimpleNamespace(src_node_id=node, reply_to_message_id=mid),
                    has_error=lambda: False,
                    content=frame_content({**answer, "cached": []}, []),
                )
            )
        return replies


@pytest.fixture(autouse=True)
def serverapp_task(monkeypatch):
    """What a ServerApp task has set (Flower's messages read it)."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 7)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Keys of sites north and south and of a spare site, as ``fed-auc certs`` writes them,
    and the Flower node id each got at registration."""
    root = make_certs(tmp_path_factory.mktemp("certs"), ["north", "south", "spare"])
    prints = read_site_keys(root / "keys")
    node_keys = {
        str(node): {"site": site, "fingerprint": prints[site]}
        for site, node in (("north", NORTH), ("south", SOUTH), ("spare", SPARE))
    }
    return SimpleNamespace(root=root, prints=prints, node_keys=node_keys)


def _transport(grid: NodesLike, identities: SiteIdentities, events: list) -> FlowerTransport:
    setup = NodeSetup("run", "codasca", {}, {}, "auc_margin", 8, 0.05, 0.0, "none", "none",
                      0, 16, 1)  # fmt: skip
    settings = FlowerSettings(expected_sites=2, min_nodes=2, register_timeout_s=2, insecure=True)
    return FlowerTransport(
        grid, setup, settings, lambda line: None, lambda *e: events.append(e), identities
    )


def _identities(keys, recorded: dict | None = None) -> SiteIdentities:
    return SiteIdentities.for_run({"node_keys": keys.node_keys}, recorded or {}, "r1")


def test_the_fingerprint_is_the_one_ssh_keygen_shows(keys):
    if shutil.which("ssh-keygen") is None:
        pytest.skip("no ssh-keygen here")
    path = keys.root / "keys" / "north.pub"
    shown = subprocess.run(["ssh-keygen", "-lf", str(path)], capture_output=True, text=True)
    assert shown.stdout.split()[1] == keys.prints["north"] == fingerprint(path.read_bytes())
    assert len(set(keys.prints.values())) == 3


def test_two_sites_listed_with_one_key_are_refused_at_start(keys, tmp_path):
    shutil.copytree(keys.root / "keys", tmp_path / "keys")
    shutil.copy(tmp_path / "keys" / "north.pub", tmp_path / "keys" / "twin.pub")
    with pytest.raises(ValueError, match=r"'north' and 'twin' .* same public key"):
        read_site_keys(tmp_path / "keys")


@pytest.mark.parametrize("order", ["after", "before"])
def test_another_key_claiming_a_joined_site_is_refused_and_logged(keys, order):
    """The spare key's node says it is north, after north joined or before: north keeps its
    place and its node, the impostor is never asked again, the events name both keys."""
    claims = {NORTH: "north", SOUTH: "south", SPARE: "north"}
    if order == "before":
        claims = {SPARE: "north", NORTH: "north", SOUTH: "south"}
    grid, events = NodesLike(claims), []
    transport = _transport(grid, _identities(keys), events)
    assert list(transport.register()) == ["north", "south"]
    assert transport.node_of == {"north": NORTH, "south": SOUTH}
    errors = [e for e in events if e[1] == "error"]
    assert len(errors) == 1
    site, _, message = errors[0]
    assert site == "north" and "impersonation attempt" in message
    assert keys.prints["spare"] in message and keys.prints["north"] in message
    transport._ask({"north": ({"kind": "train"}, [])}, "train", 1.0)
    assert [node for node, kind in grid.asked if kind == "train"] == [NORTH]
    assert [node for node, _ in grid.asked].count(SPARE) == 1  # its claim, once


def test_a_sites_key_cannot_speak_for_another_site(keys):
    grid, events = NodesLike({NORTH: "north", SOUTH: "north"}), []
    transport = _transport(grid, _identities(keys), events)
    transport._discover(timeout=1.0)
    assert transport.node_of == {"north": NORTH}
    (error,) = [e for e in events if e[1] == "error"]
    assert "key of site south" in error[2] and "says it is site north" in error[2]


def test_the_same_key_coming_back_is_a_reconnect(keys):
    identities = _identities(keys)
    assert identities.claim("north", NORTH) is None
    identities.node_keys[404] = keys.prints["north"]  # the same key under a new node id
    assert identities.claim("north", 404) is None
    assert identities.claim("north", SPARE) is not None
    assert "no key registered" in identities.claim("north", 999)


def test_a_resumed_run_keeps_the_binding_of_its_first_registration(keys):
    """The run recorded north's key; keys/north.pub now holds the spare key (the key files
    changed between the coordinator's starts): the record wins."""
    recorded = {"site_keys": {"north": keys.prints["north"]}}
    node_keys = {str(SPARE): {"site": "north", "fingerprint": keys.prints["spare"]}}
    identities = SiteIdentities.for_run({"node_keys": node_keys}, recorded, "r1")
    assert "impersonation attempt" in identities.claim("north", SPARE)
    assert identities.record(["north"]) == recorded
    swapped = {"site_keys": {"north": keys.prints["south"]}}  # south's key is north's now
    with pytest.raises(ValueError, match="a site's key changes between runs"):
        _identities(keys, swapped)
    with pytest.raises(ValueError, match="certs_dir"):  # resumed without node keys
        SiteIdentities.for_run({}, recorded, "r1")


def test_without_node_keys_nothing_is_checked_and_the_record_stays_readable(keys):
    unchecked = SiteIdentities.for_run({}, {}, "r1")
    assert unchecked.claim("north", 5) is None and unchecked.record(["north"]) == {}
    record = {"rounds": 1, "transport": "flower", "site_keys": {"north": keys.prints["north"]}}
    assert recorded_config(record, "runs").rounds == 1


def test_the_coordinator_refuses_two_sites_with_one_key_before_starting_anything(keys, tmp_path):
    """``fed-auc coordinator`` over a certs folder in which two sites share a key: it stops
    before the SuperLink starts (no process), naming both sites; the run is marked failed."""
    from fed_auc.experiment.config import ExperimentConfig
    from fed_auc.store.run_store import RunStore
    from fed_auc.transport.flower.launch import CoordinatorFailed, run_coordinator

    shutil.copytree(keys.root, tmp_path / "certs")
    shutil.copy(tmp_path / "certs/keys/north.pub", tmp_path / "certs/keys/twin.pub")
    config = ExperimentConfig(rounds=1, runs_dir=str(tmp_path / "runs")).to_dict()
    flower = {"certs_dir": str(tmp_path / "certs"), "address": "127.0.0.1:1"}
    with pytest.raises(CoordinatorFailed, match=r"'north' and 'twin' .* same public key"):
        run_coordinator({"experiment": config, "flower": flower}, tmp_path / "work", print)
    assert not (tmp_path / "work" / "superlink.log").exists()
    with RunStore(tmp_path / "runs") as store:
        assert store.runs()["status"].tolist() == ["failed"]
