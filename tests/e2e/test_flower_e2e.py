"""Real Flower runs on loopback: a SuperLink, three SuperNodes, TLS and node keys.

One set of three registered nodes serves every test of this module (a node outlives a
coordinator: its SuperNode reconnects to the next one on the same port), so each test pays
only for its coordinator. Intruders (a key the coordinator never registered, no CA) try to
join the first run. The kill/rejoin run is checked against an in-process simulation in which
the same sites miss the same rounds: equal models mean the restarted node went on from the
local state it had saved.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import load_state, load_torch
from fed_auc.node.node import LOCAL_STATE_FILE, PENDING_STATE_FILE, Node
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore
from fed_auc.transport.flower.certs import make_certs
from fed_auc.transport.flower.processes import free_port
from tests.support.flower_loopback import NO_CA, SITES, UNREGISTERED, _site_toml
from tests.support.processes import start_fed_auc, stop_all, wait_for_line

SMALL = {"rounds": 2, "local_steps": 2, "batch_size": 8}
ROW_COLUMNS = ["round", "site", "status", "steps", "n", "auc", "val_auc", "update_norm", "bytes_up"]
NUMERIC = [c for c in ROW_COLUMNS if c not in ("site", "status")]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@dataclass
class Federation:
    root: Path
    port: int
    nodes: dict[str, subprocess.Popen]

    def start_node(self, site: str, *args: str) -> subprocess.Popen:
        if not args:
            args = ("--root-certificates", "certs/ca.pem", "--auth-key", f"certs/keys/{site}.key")
        command = ["node", "--site", str(_site_toml(self.root, site))]
        command += ["--coordinator", f"127.0.0.1:{self.port}", *args]
        return _start(self.root, *command, log=f"{site}.log")

    def coordinator(
        self, name: str, rounds: int, options: dict | None = None, **flower
    ) -> subprocess.Popen:
        config = _experiment(self.root, name, self.port, rounds, options or {}, **flower)
        args = ("coordinator", "--config", str(config), "--json")
        return _start(self.root, *args, log=f"{name}.log", session=True)


def _simulated(fed: Federation, name: str, **options) -> dict:
    """The same experiment in-process, on the same site files."""
    files = [str(_site_toml(fed.root, site)) for site in SITES]
    config = {**SMALL, **options, "site_files": files, "runs_dir": str(fed.root / name)}
    return run_simulation(ExperimentConfig(**config))


def _experiment(root: Path, name: str, port: int, rounds: int, extra: dict, **flower) -> Path:
    options = {**SMALL, **extra, "rounds": rounds, "runs_dir": f"runs_{name}"}
    lines = [f"{k} = {json.dumps(v)}" for k, v in options.items()]
    settings = {
        "address": f"127.0.0.1:{port}",
        "min_nodes": 2,
        "expected_sites": 3,
        "register_timeout_s": 300,
        "pooled_scoring": True,
        "certs_dir": "certs",
        **flower,
    }
    lines += ["[flower]"] + [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    path = root / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _start(root: Path, *args: str, log: str, session: bool = False) -> subprocess.Popen:
    return start_fed_auc(root, *args, log=root / log, session=session)


def _finish(fed: Federation, name: str, coordinator: subprocess.Popen) -> dict:
    log = fed.root / f"{name}.log"
    assert coordinator.wait(timeout=600) == 0, log.read_text()[-3000:]
    text = log.read_text()
    return json.loads(text[text.index('{\n  "run_id"') :])


def _rows(runs: Path, run_id: str):
    with RunStore(runs) as store:
        return store.site_rounds(run_id)[ROW_COLUMNS].sort_values(["round", "site"], kind="stable")


def _assert_same_model(summary: dict, expected: dict) -> None:
    model = load_torch(Path(summary["model_path"]))["state_dict"]
    for name, tensor in load_torch(Path(expected["model_path"]))["state_dict"].items():
        torch.testing.assert_close(model[name], tensor, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    root = tmp_path_factory.mktemp("flower")
    make_certs(root / "certs", SITES)
    make_certs(root / "other", [UNREGISTERED])  # a key the coordinator never registers
    federation = Federation(root, free_port(), {})
    federation.nodes = {site: federation.start_node(site) for site in SITES}
    yield federation
    stop_all(federation.nodes.values())


def test_three_nodes_equal_the_in_process_simulation_and_intruders_cannot_join(fed):
    intruders = [
        fed.start_node(
            UNREGISTERED,
            "--root-certificates",
            "certs/ca.pem",
            "--auth-key",
            str(fed.root / "other/keys" / f"{UNREGISTERED}.key"),
        ),
        fed.start_node(NO_CA, "--insecure"),  # plain HTTP to a TLS port
    ]
    coordinator = fed.coordinator("equal", rounds=2, min_nodes=3)
    try:
        summary = _finish(fed, "equal", coordinator)
    finally:
        stop_all(intruders)
    expected = _simulated(fed, "sim")
    assert summary["global_auc"] == pytest.approx(expected["global_auc"], abs=1e-6)
    assert summary["site_auc"] == pytest.approx(expected["site_auc"], abs=1e-6)
    got = _rows(fed.root / "runs_equal", summary["run_id"])
    want = _rows(fed.root / "sim", expected["run_id"])
    assert got["status"].tolist() == want["status"].tolist()
    assert (got["status"][got["round"] > 0] == "completed").all()
    assert got[NUMERIC].to_numpy() == pytest.approx(want[NUMERIC].to_numpy(), abs=1e-5, nan_ok=True)
    _assert_same_model(summary, expected)
    with RunStore(fed.root / "runs_equal") as store:
        assert store.run(summary["run_id"])["status"] == "completed"
        assert sorted(store.sites(summary["run_id"])["site"]) == sorted(SITES)
    # The intruders were up and trying, and never joined.
    log = (fed.root / "equal.log").read_text()
    assert all(f"site {site} joined" in log for site in SITES)
    assert UNREGISTERED not in log and NO_CA not in log
    for site in (UNREGISTERED, NO_CA):
        assert "node up" in (fed.root / f"{site}.log").read_text()
        assert not (fed.root / "nodes" / site / summary["run_id"]).exists()  # never asked
    refused = (fed.root / "nodes" / UNREGISTERED / "supernode.log").read_text()
    assert "Failed to activate SuperNode" in refused  # the SuperLink refused its key


def test_compressed_rounds_over_flower_equal_the_in_process_ones(fed):
    """--compress int8: the same int8 bytes leave the nodes over Flower as in-process (the same
    rows, bytes included, and the same model)."""
    coordinator = fed.coordinator("int8", rounds=2, options={"compress": "int8"}, min_nodes=3)
    summary = _finish(fed, "int8", coordinator)
    expected = _simulated(fed, "sim_int8", compress="int8")
    got = _rows(fed.root / "runs_int8", summary["run_id"])
    want = _rows(fed.root / "sim_int8", expected["run_id"])
    assert (got["status"][got["round"] > 0] == "completed").all()
    assert got[NUMERIC].to_numpy() == pytest.approx(want[NUMERIC].to_numpy(), abs=1e-5, nan_ok=True)
    model = load_torch(Path(summary["model_path"]))["state_dict"]
    fp32 = sum(t.numel() * 4 for t in model.values() if t.is_floating_point())
    assert (got["bytes_up"][got["round"] > 0] < fp32 / 3.3).all()  # 3.75 x on the tiny model
    _assert_same_model(summary, expected)


def test_a_killed_node_is_dropped_and_rejoins_with_its_local_state(fed, monkeypatch):
    victim = "mercy_rural"
    name = "rejoin"
    # Rounds of the tiny model take about 2 s over Flower once the SuperLink knows the node is
    # gone: enough of them for a restarted node (a fresh process importing torch, checking its
    # data and starting its SuperNode: about a minute at load 5) to rejoin.
    rounds = 60
    # The last round's model is compared: which round validates best depends on the rounds
    # in which the killed node's evaluation was missing, and the in-process mirror evaluates.
    last = {"select": "last"}
    coordinator = fed.coordinator(name, rounds, last, round_timeout_s=60, eval_timeout_s=45)
    log = fed.root / f"{name}.log"
    wait_for_line(log, "round 1:", coordinator, timeout=400)
    fed.nodes[victim].send_signal(signal.SIGKILL)  # no clean-up: its SuperNode dies with it
    fed.nodes[victim].wait(timeout=60)
    # Restarted only once the coordinator has dropped it: a restart that answers the round in
    # flight (same key, same node id) in time would never be recorded as dropped.
    wait_for_line(log, f"site {victim} left", coordinator, timeout=400)
    fed.nodes[victim] = fed.start_node(victim)  # the same state_dir and key
    summary = _finish(fed, name, coordinator)

    rows = _rows(fed.root / f"runs_{name}", summary["run_id"])
    status = {(r.site, r.round): r.status for r in rows.itertuples()}
    # A round lasts about a second: the node may answer round 2 before the kill lands.
    dropped = [r for r in range(2, rounds + 1) if status[(victim, r)] == "dropped"]
    assert dropped, "the killed node was never recorded as dropped"
    after = [status[(victim, r)] for r in range(dropped[0] + 1, rounds + 1)]
    assert "completed" in after  # rejoined
    with RunStore(fed.root / f"runs_{name}") as store:
        events = " ".join(store.events(summary["run_id"])["message"])
    assert f"site {victim} left" in events and f"site {victim} rejoined after" in events
    # Its key is registered: a refusal while the coordinator held its old session is said so.
    console = (fed.root / f"{victim}.log").read_text()
    assert "this key is not registered" not in console, console
    # Rounds a busy machine made other sites miss are mirrored below as well.
    missed = {key for key, value in status.items() if key[1] > 0 and value != "completed"}
    # After the restart it wrote state for a later round than any before the kill.
    state_dir = fed.root / "nodes" / victim / summary["run_id"]
    tags = [load_state(state_dir / f)["tag"] for f in (LOCAL_STATE_FILE, PENDING_STATE_FILE)
            if (state_dir / f).exists()]  # fmt: skip
    assert max(tags) >= [dropped[0], 0]  # [round index, phase]: a round after the drop

    # The same run in-process, with the same sites missing the same rounds.
    original = Node.train

    def train(self, broadcast):
        if (self.name, broadcast.round + 1) in missed:
            raise TimeoutError("missed the deadline")
        return original(self, broadcast)

    monkeypatch.setattr(Node, "train", train)
    expected = _simulated(fed, "sim_rejoin", **last, rounds=rounds)
    _assert_same_model(summary, expected)
    want = _rows(fed.root / "sim_rejoin", expected["run_id"])
    done = [  # rows of rounds every transport completed, training and evaluation
        (site, round_) not in missed and auc == auc
        for site, round_, auc in zip(rows["site"], rows["round"], rows["auc"], strict=True)
    ]
    assert rows[done][NUMERIC].to_numpy() == pytest.approx(
        want[done][NUMERIC].to_numpy(), abs=1e-5, nan_ok=True
    )


def test_a_killed_coordinator_resumes_its_run_to_the_uninterrupted_result(fed):
    name = "resume"
    coordinator = fed.coordinator(name, rounds=3)
    wait_for_line(fed.root / f"{name}.log", "round 1:", coordinator, timeout=400)
    os.killpg(coordinator.pid, signal.SIGKILL)  # with its SuperLink and ServerApp
    coordinator.wait(timeout=60)
    runs = fed.root / f"runs_{name}"
    deadline = time.monotonic() + 60  # the ServerApp fails the run once its coordinator is gone
    with RunStore(runs) as store:
        run_id = store.runs()["id"].iloc[0]
        while store.run(run_id)["status"] == "running" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert store.run(run_id)["status"] == "failed"
        assert "ended without stopping its run" in store.run(run_id)["summary"]["error"]
        assert 1 <= store.rounds(run_id)["round"].max() < 3
    args = ("coordinator", "--resume", run_id, "--runs-dir", str(runs), "--json")
    summary = _finish(fed, "resumed", _start(fed.root, *args, log="resumed.log"))

    expected = _simulated(fed, "sim_resume", rounds=3)
    assert summary["run_id"] == run_id
    assert summary["global_auc"] == pytest.approx(expected["global_auc"], abs=1e-6)
    _assert_same_model(summary, expected)
    got, want = _rows(runs, run_id), _rows(fed.root / "sim_resume", expected["run_id"])
    assert got["status"].tolist() == want["status"].tolist()  # every round exactly once
    assert got[NUMERIC].to_numpy() == pytest.approx(want[NUMERIC].to_numpy(), abs=1e-5, nan_ok=True)
    with RunStore(runs) as store:
        assert store.run(run_id)["status"] == "completed"
        assert any("run resumed after round" in m for m in store.events(run_id)["message"])


def test_init_weights_are_broadcast_by_the_coordinator(fed):
    """``init`` over Flower: the coordinator reads the file (an ImageNet-named state_dict) and
    broadcasts it; the nodes, which never see the file, normalize their inputs as the exported
    model says, so the run equals the in-process one from the same file."""
    from benchmarks.common.weight_files import densenet_file

    weights = fed.root / "imagenet.pth"
    torch.save(densenet_file("tiny", 1000, 3), weights)
    coordinator = fed.coordinator("init", rounds=1, options={"init": str(weights)})
    summary = _finish(fed, "init", coordinator)
    expected = _simulated(fed, "sim_init", rounds=1, init=str(weights))
    assert summary["global_auc"] == pytest.approx(expected["global_auc"], abs=1e-6)
    _assert_same_model(summary, expected)
    card = json.loads((Path(summary["model_path"]).parent / "model_card.json").read_text())
    assert card["init"]["input"] == "imagenet" and card["model_config"]["input"] == "imagenet"
