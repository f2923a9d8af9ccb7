"""A node's and a coordinator's faults in one line each, on the console of the role that can act.

The SuperNode logs below are Flower 1.42's own, captured on loopback: ``fed-auc node`` against
nothing, against a SuperLink whose certificate another CA signed, and against a SuperLink
that does not know the node's key.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from fed_auc.cli import main  # noqa: E402
from fed_auc.transport.flower.node_watch import (  # noqa: E402
    StateDirBusy,
    SupernodeWatch,
    explain,
    lock_state_dir,
    unlock_state_dir,
)

ADDRESS = "10.1.2.3:9092"
STARTED = "INFO :      Starting Flower SuperNode\nINFO :      FastAPI lifespan: startup\n"
UNREACHABLE = (
    "WARNING :   Option `--insecure` was set. Starting insecure channel to 10.1.2.3:9092.\n"
    "WARNING :   Connection attempt failed, retrying in 0.33 seconds\n"
    "WARNING :   Connection attempt failed, retrying in 0.74 seconds\n"
)
WRONG_CA = """\
ERROR :     SSL/TLS handshake error detected.
ERROR :     Exit Code: 305
Failed to initialize the connection to the SuperLink.
[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: certificate signature failure (_ssl.c:1006)
The SuperNode could not establish a connection to the SuperLink.
"""  # noqa: E501
NOT_REGISTERED = """\
ERROR :     Exit Code: 305
Failed to initialize the connection to the SuperLink.
[code: 2004] Failed to activate SuperNode.
The SuperNode could not establish a connection to the SuperLink.
"""
JOINED = "INFO :      SuperNode ID: 13481341554847947232\n"


def test_each_supernode_failure_is_named_in_one_line():
    ca = Path("/etc/fed/ca.pem")
    assert explain(STARTED + UNREACHABLE, ADDRESS).startswith(f"cannot reach {ADDRESS}")
    wrong = explain(STARTED + WRONG_CA, ADDRESS, ca)
    assert wrong.startswith("TLS verification failed: the CA does not match")
    assert str(ca) in wrong and ADDRESS in wrong
    assert explain(STARTED + NOT_REGISTERED, ADDRESS).startswith("this key is not registered")
    assert "401" in explain("... 401 Unauthorized ...", ADDRESS)
    assert explain(STARTED + JOINED, ADDRESS) is None
    assert explain("Exit Code: 1\nsomething else", ADDRESS) is None


def test_the_watch_says_a_cause_once_and_when_the_node_joins(tmp_path):
    log = tmp_path / "supernode.log"
    watch = SupernodeWatch("north", ADDRESS)
    assert watch.feed(STARTED) == []
    first = watch.feed(STARTED + UNREACHABLE)
    assert first == [f"north: cannot reach {ADDRESS}: " + first[0].split(": ", 2)[2]]
    assert first[0].endswith("; retrying")
    assert watch.feed(STARTED + UNREACHABLE * 3) == []  # not at every retry
    assert watch.feed(STARTED + UNREACHABLE * 3 + JOINED) == [
        f"north: connected to the coordinator at {ADDRESS}"
    ]
    # a SuperNode that exits: its cause once, then nothing while the cause stays the same
    watch.feed(STARTED + WRONG_CA)
    line = watch.exited(1, log)
    assert line.startswith("north: TLS verification failed: the CA does not match")
    watch.feed(STARTED + WRONG_CA)
    assert watch.exited(1, log) == ""
    watch.feed(STARTED + NOT_REGISTERED)
    assert watch.exited(1, log).startswith("north: this key is not registered at the coordinator")
    watch.feed("Traceback ...\nKeyError: 'x'\n")
    assert watch.exited(1, log) == f"north: SuperNode exited with 1; restarting (its log: {log})"


HOLD = """\
import sys, time
from pathlib import Path
from fed_auc.transport.flower.node_watch import lock_state_dir
lock_state_dir(Path(sys.argv[1]))
print("locked", flush=True)
time.sleep(60)
"""


def _holder(state_dir: Path) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(state_dir)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_second_node_on_a_state_directory_is_refused_at_once(tmp_path):
    state = tmp_path / "nodes" / "north"
    holder = _holder(state)
    try:
        with pytest.raises(StateDirBusy, match="another node is running on this state directory"):
            lock_state_dir(state)
    finally:
        holder.kill()
        holder.wait()
    lock = lock_state_dir(state)  # the kernel released it with the process
    assert lock_state_dir(state) == lock  # this process may hold it twice
    unlock_state_dir(lock)
    unlock_state_dir(lock)


def test_fed_auc_node_refuses_a_state_directory_in_use_before_loading_data(tmp_path):
    site = tmp_path / "north.toml"  # its data file does not even exist: the lock comes first
    site.write_text('name = "north"\n[data]\nspec = "medmnist:gone.npz"\n')
    holder = _holder(tmp_path / "nodes" / "north")
    try:
        with pytest.raises(SystemExit) as refused:
            main(["node", "--site", str(site), "--coordinator", "127.0.0.1:1", "--insecure"])
    finally:
        holder.kill()
        holder.wait()
    message = str(refused.value.code)
    assert message.startswith("fed-auc node: north: another node is running on this state")
    assert f"(process {holder.pid})" in message


def _children(pid: int) -> list[int]:
    """Every living descendant of ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found += kids
        todo += kids
    return found


@pytest.mark.slow
def test_a_node_with_nothing_at_its_address_says_it_cannot_reach_it(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    site = tmp_path / "north.toml"
    site.write_text(
        'name = "north"\n[synthetic]\nn_train = 30\nn_val = 20\nn_test = 20\nprevalence = 0.3\n'
        "[node]\nindex = 0\n"
    )
    log = tmp_path / "node.log"
    command = [sys.executable, "-m", "fed_auc.cli", "node", "--site", str(site)]
    command += ["--coordinator", f"127.0.0.1:{port}", "--insecure"]
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    with open(log, "w") as out:
        node = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while "cannot reach" not in log.read_text():
            assert node.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        children = _children(node.pid)
        assert children  # its SuperNode
        node.send_signal(signal.SIGTERM)
        node.wait(timeout=60)
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
    text = log.read_text()
    assert f"node up, coordinator 127.0.0.1:{port}" in text
    assert f"north: cannot reach 127.0.0.1:{port}: nothing answers there" in text
    assert text.count("cannot reach") == 1
    assert "Traceback" not in text
    time.sleep(1)
    assert not [p for p in children if Path(f"/proc/{p}").exists()]
