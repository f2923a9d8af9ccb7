"""Node local state: atomic, checksummed, and committed only when the federation kept the reply."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from fed_auc.algorithms import build_backend
from fed_auc.data.synthetic import make_synthetic_federation
from fed_auc.io import CorruptState, load_state, save_state
from fed_auc.losses import build_loss
from fed_auc.models import build_model
from fed_auc.node.node import LOCAL_STATE_FILE, PENDING_STATE_FILE, LocalTraining, Node
from fed_auc.trainable import Trainable


def test_a_flipped_byte_or_a_cut_file_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "local_state.pt"
    save_state({"v": torch.arange(1000.0)}, path)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptState, match=f"{path}: checksum mismatch"):
        load_state(path)
    path.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(CorruptState, match="truncated or altered"):
        load_state(path)
    path.write_bytes(b"PK\x03\x04 a zip, not ours")
    with pytest.raises(CorruptState, match="not a fed-auc state file"):
        load_state(path)


WRITER = textwrap.dedent(
    """
    import sys, torch
    from fed_auc.io import save_state
    path = sys.argv[1]
    version = 0
    while True:
        version += 1
        save_state({"version": version, "c": torch.full((400_000,), float(version))}, path)
        print(version, flush=True)
    """
)


@pytest.mark.slow
def test_a_node_killed_while_writing_keeps_a_whole_state(tmp_path: Path) -> None:
    path = tmp_path / LOCAL_STATE_FILE
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, env=os.environ
    )
    written = []
    while len(written) < 3:  # several whole writes, then a kill that lands mid-write or not
        written.append(int(writer.stdout.readline()))
    time.sleep(0.013)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    state = load_state(path)  # never a torn file: checksum holds
    assert state["version"] >= written[-1]
    assert torch.equal(state["c"], torch.full((400_000,), float(state["version"])))
    (tmp_path / f".{LOCAL_STATE_FILE}.x1.tmp").write_bytes(b"half")  # as a kill mid-write leaves
    make_node(tmp_path)  # a node starting there clears the leftovers
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCAL_STATE_FILE]


def make_node(state_dir: Path) -> tuple[Node, dict]:
    site = make_synthetic_federation(num_sites=1, seed=3, scale=0.3)[0]
    backend = build_backend("codasca", local_steps=2, seed=0)
    model = build_model("tiny")
    torch.manual_seed(0)
    server = Trainable(model, build_loss("auc_margin", 1, [0.5]))
    state = backend.init_server(server, {site.name: len(site.train)})
    return Node(site, backend, LocalTraining(model.config(), "auc_margin"), state_dir), state


def request(node: Node, state: dict, round_: int, commit, follow=None):
    broadcast = node.backend.plan({**state, "round": round_}, round_)
    broadcast.config.update(pos_ratio=[0.3], commit=commit, **{"continue": follow})
    return broadcast


def control(node: Node) -> torch.Tensor:
    return torch.cat([t.flatten() for t in node._local_state["control"].values()])


def test_pending_state_is_promoted_only_when_the_reply_was_kept(tmp_path: Path) -> None:
    node, state = make_node(tmp_path)
    node.train(request(node, state, 0, commit=None))
    after_round0 = control(node).clone()
    assert load_state(tmp_path / PENDING_STATE_FILE)["tag"] == [0, 0]
    assert not (tmp_path / LOCAL_STATE_FILE).exists()

    node.train(request(node, state, 1, commit=[0, 0]))  # round 0's reply was kept
    assert load_state(tmp_path / LOCAL_STATE_FILE)["tag"] == [0, 0]
    committed = load_state(tmp_path / LOCAL_STATE_FILE)["backend"]["control"]
    assert torch.equal(torch.cat([t.flatten() for t in committed.values()]), after_round0)

    node.train(request(node, state, 2, commit=[0, 0]))  # round 1's reply was dropped
    assert load_state(tmp_path / PENDING_STATE_FILE)["tag"] == [2, 0]
    # round 2 started from round 0's state: the same as a node that never did round 1
    twin, _ = make_node(tmp_path / "twin")
    twin.train(request(twin, state, 0, commit=None))
    twin.train(request(twin, state, 2, commit=[0, 0]))
    assert torch.equal(control(node), control(twin))


def test_a_restarted_node_resumes_from_disk_as_the_request_says(tmp_path: Path) -> None:
    node, state = make_node(tmp_path)
    node.train(request(node, state, 0, commit=None))
    kept = control(node).clone()
    sampler = node.batches.state_dict()

    restarted, _ = make_node(tmp_path)  # same state dir, nothing in memory
    restarted._sync_local_state(request(restarted, state, 1, commit=[0, 0]))
    assert torch.equal(control(restarted), kept)
    assert torch.equal(restarted.batches.state_dict()["generator"], sampler["generator"])

    again, _ = make_node(tmp_path / "again")
    again.train(request(again, state, 0, commit=None))
    again_restarted, _ = make_node(tmp_path / "again")
    again_restarted._sync_local_state(request(again_restarted, state, 0, commit=None))
    assert again_restarted._local_state == {}  # the coordinator redoes round 0: start over
    assert not (tmp_path / "again" / PENDING_STATE_FILE).exists()
