"""A node's and a coordinator's faults in one line each, on the console of the role that can act.

The SuperNode logs below are Flower 1.42's own, captured on loopback: ``fed-auc node`` against
nothing, against a SuperLink whose certificate another CA signed, and against a SuperLink
that does not know the node's key.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from fed_auc.cli import main  # noqa: E402
from fed_auc.store.run_store import RunStore
from fed_auc.transport.flower.node_watch import (  # noqa: E402
    StateDirBusy,
    SupernodeWatch,
    explain,
    lock_state_dir,
    unlock_state_dir,
)
from tests.support.processes import start_fed_auc, stop_all, wait_for_line

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
    watch = SupernodeWatch("north", "127.0.0.1:1")  # nothing listens on port 1
    assert watch.feed(STARTED + UNREACHABLE)[0].startswith("north: cannot reach 127.0.0.1:1")
    watch = SupernodeWatch("north", ADDRESS)
    watch.listening = lambda: False  # 10.1.2.3 is not asked
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
    assert watch.exited(1, log).startswith(f"north: the coordinator at {ADDRESS} does not let")
    watch.refused_since -= 31  # refused for longer than a starting coordinator takes
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


def test_a_port_that_answers_but_not_to_the_supernode_is_named_so():
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        line = SupernodeWatch("north", address).feed(STARTED + UNREACHABLE)
    assert line == [
        f"north: {address} accepts connections but the SuperNode cannot talk to it: TLS on one "
        "side only? (--insecure against a coordinator with TLS, or the address of another "
        "service); retrying"
    ]


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
    command = ["node", "--site", str(site), "--coordinator", f"127.0.0.1:{port}", "--insecure"]
    node = start_fed_auc(tmp_path, *command, log=log)
    try:
        wait_for_line(log, "cannot reach", node, timeout=120)
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


# -- the coordinator ---------------------------------------------------------------------------
def test_a_round_without_enough_replies_names_the_sites_that_missed():
    from fed_auc.exchange import NodeFailure
    from fed_auc.transport.flower.transport import too_few_replies

    answers = {
        "site_a": ({"kind": "train"}, []),
        "site_b": NodeFailure("site_b", "dropped", "no answer within 60 s"),
        "site_c": NodeFailure("site_c", "error", "node site_c: OSError: disk full"),
    }
    assert too_few_replies(answers, 3) == (
        "1 of 3 nodes replied (min_nodes 3); missed: site_b (no answer within 60 s); "
        "site_c (node site_c: OSError: disk full)"
    )


def _coordinator(
    tmp_path: Path, register_timeout_s: float, rounds: int = 2, **flower
) -> tuple[subprocess.Popen, Path]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "experiment.toml"
    flower = {"expected_sites": 1, **flower, "register_timeout_s": register_timeout_s}
    config.write_text(
        f'rounds = {rounds}\nlocal_steps = 2\nbatch_size = 8\nruns_dir = "runs"\n[flower]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n'
        + "".join(f"{key} = {value}\n" for key, value in flower.items())
    )
    log = tmp_path / "coordinator.log"
    process = start_fed_auc(tmp_path, "coordinator", "--config", str(config), log=log)
    return process, log


def _run(tmp_path: Path) -> dict:
    with RunStore(tmp_path / "runs") as store:
        return store.run(store.runs()["id"].iloc[0])


@pytest.mark.slow
def test_a_failed_flower_run_is_one_line_with_how_to_resume_and_no_traceback(tmp_path):
    process, log = _coordinator(tmp_path, register_timeout_s=2)
    try:
        assert process.wait(timeout=300) == 1
    finally:
        stop_all([process])
    text = log.read_text()
    run = _run(tmp_path)
    assert run["status"] == "failed"
    assert "Traceback" not in text
    assert "only 0 site(s) joined within 2 s ([]); min_nodes = 1" in text
    assert (
        f"The run is saved; continue it with `fed-auc coordinator --resume {run['id']} "
        f"--runs-dir {tmp_path / 'runs'}`"
    ) in text


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_coordinator_stops_everything_it_started(tmp_path, stop):
    process, log = _coordinator(tmp_path, register_timeout_s=300)
    children: list[int] = []
    try:
        wait_for_line(log, "waiting for 1 site(s)", process, timeout=180)  # the ServerApp runs
        children = _children(process.pid)
        assert len(children) >= 3  # the SuperLink, its SuperExec, the ServerApp, `flwr run`
        assert any("flwr-serverapp" in _command(p) for p in children)
        process.send_signal(stop)
        process.wait(timeout=60)
        deadline = time.monotonic() + 60
        while [p for p in children if _running(p)] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in children if _running(p)], log.read_text()
    finally:
        for pid in [process.pid, *children]:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        if process.poll() is None:
            process.wait()
    run = _run(tmp_path)
    assert run["status"] == "failed"  # resumable either way
    resume = f"continue it with `fed-auc coordinator --resume {run['id']} --runs-dir"
    if stop == signal.SIGTERM:
        assert process.returncode == 130
        assert resume in log.read_text()
        assert "Traceback" not in log.read_text()
    else:  # no one left to say it but the ServerApp, which failed the run before it exited
        reason = run["summary"]["error"]
        assert reason.startswith(
            f"the coordinator process (PID {process.pid}) ended without stopping its run. "
        )
        assert resume in reason
        with RunStore(tmp_path / "runs") as store:
            assert reason in store.events(run["id"])["message"].tolist()


def test_the_serverapp_knows_its_coordinator_by_pid_and_start_time():
    """A SIGKILLed coordinator is a zombie until reaped, and its PID may be reused later:
    neither is taken for the coordinator still running."""
    from fed_auc.transport.flower.coordinator_watch import ProcessIdentity, start_time

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        coordinator = ProcessIdentity(child.pid, start_time(child.pid))
        assert coordinator.alive()
        assert not ProcessIdentity(child.pid, coordinator.started - 1).alive()  # a reused PID
        child.kill()
        deadline = time.monotonic() + 10
        while coordinator.alive() and time.monotonic() < deadline:  # a zombie: not reaped yet
            time.sleep(0.05)
        assert not coordinator.alive() and Path(f"/proc/{child.pid}").exists()
    finally:
        child.kill()
        child.wait()
    assert ProcessIdentity.current().alive()


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _running(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False


def test_the_coordinator_says_once_per_key_that_a_node_was_refused(tmp_path):
    from fed_auc.transport.flower.launch import _key_refusals

    line = (
        "ERROR :     [/v1/fleet/activate-node][ApiError:2004] Attempted to register SuperNode "
        "with public key: b'-----BEGIN PUBLIC KEY-----\\nMHYwEAYHKoZI\\n-----END PUBLIC KEY-----"
        "\\n', exception: No SuperNode found with the given public key.\n"
    )
    select = _key_refusals(["north.pub", "south.pub"], tmp_path / "keys")
    said = select(line)
    assert said.startswith("a node tried to join with a key that is not registered here")
    assert "['north.pub', 'south.pub']" in said and str(tmp_path / "keys") in said
    assert select(line) is None  # its retries are not repeated
    assert select("INFO :      SuperLinkLifespan: start\n") is None
    assert select(line.replace("MHYwEAYHKoZI", "OTHERKEY")) is not None  # another node's key


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_node_that_dies_under_min_nodes_ends_the_run_in_one_line_naming_it(tmp_path):
    """The issue's case: `min_nodes = 3`, one node dies; the coordinator says which site
    missed and how to resume, without a traceback."""
    from tests.support.flower_loopback import SITES, _site_toml

    process, log = _coordinator(
        tmp_path, 300, rounds=6, min_nodes=3, expected_sites=3, round_timeout_s=45
    )
    address = re.search(r'address = "([^"]+)"', (tmp_path / "experiment.toml").read_text())[1]
    nodes = {}
    for site in SITES:
        command = ["node", "--site", str(_site_toml(tmp_path, site))]
        nodes[site] = start_fed_auc(
            tmp_path, *command, "--coordinator", address, "--insecure", log=tmp_path / f"{site}.log"
        )
    try:
        wait_for_line(log, "round 1:", process, timeout=400)
        nodes["mercy_rural"].kill()  # SIGKILL: its SuperNode goes with it (PR_SET_PDEATHSIG)
        assert process.wait(timeout=300) == 1, log.read_text()
    finally:
        stop_all([*nodes.values(), process])
    text = log.read_text()
    run = _run(tmp_path)
    assert run["status"] == "failed"
    assert "Traceback" not in text
    assert re.search(
        r"round \d+ failed: 2 of 3 nodes replied \(min_nodes 3\); missed: mercy_rural \(", text
    ), text
    assert f"continue it with `fed-auc coordinator --resume {run['id']} --runs-dir" in text


@pytest.mark.slow
def test_at_the_end_of_a_run_the_node_says_so_not_that_the_coordinator_is_gone(tmp_path):
    from tests.support.flower_loopback import _site_toml

    process, log = _coordinator(tmp_path, 300, rounds=1)
    address = re.search(r'address = "([^"]+)"', (tmp_path / "experiment.toml").read_text())[1]
    node_log = tmp_path / "node.log"
    site = str(_site_toml(tmp_path, "mercy_rural"))
    command = ["node", "--site", site, "--coordinator", address, "--insecure"]
    node = start_fed_auc(tmp_path, *command, log=node_log)
    try:
        assert process.wait(timeout=300) == 0, log.read_text()
        wait_for_line(node_log, "completed at the coordinator", node, timeout=60)
        # its SuperNode finds the coordinator gone; the node reads that log every second
        supernode_log = tmp_path / "nodes" / "mercy_rural" / "supernode.log"
        wait_for_line(supernode_log, "Connection attempt failed", node, timeout=60)
        time.sleep(3)
    finally:
        stop_all([node])
    text = node_log.read_text()
    completed = (
        f"mercy_rural: run {_run(tmp_path)['id']} completed at the coordinator; this node waits "
        "for the next run (Ctrl-C stops it)"
    )
    assert completed in text
    # A node started before the coordinator listens may say "cannot reach" first; after the
    # run's end, the coordinator going away is no fault.
    after_end = text[text.index(completed) :]
    assert "cannot reach" not in after_end and "SuperNode exited" not in after_end, text
    assert "Traceback" not in text


def test_a_node_refuses_a_batch_larger_than_its_training_split_in_one_line(tmp_path):
    from fed_auc.site import SiteDefinition
    from fed_auc.transport.flower.worker import NodeWorker
    from tests.support.flower_worker import _setup, _site_toml

    setup, _ = _setup()
    setup["batch_size"] = 1_000_000
    lines: list[str] = []
    worker = NodeWorker(SiteDefinition.from_toml(_site_toml(tmp_path, "mercy_rural", 2)),
                        lines.append)  # fmt: skip
    with pytest.raises(ValueError, match="batch size 1000000 is larger than its training"):
        worker.handle({"kind": "register", "setup": setup}, [])
    assert len(lines) == 1
    assert lines[0].startswith("mercy_rural: refused a register request: site 'mercy_rural' (")
    assert "mercy_rural.toml): batch size 1000000 is larger than its training split" in lines[0]
    assert not (tmp_path / "nodes" / "mercy_rural" / "run1").exists()  # nothing built
