"""What the consoles of ``fed-auc coordinator`` and ``fed-auc node`` say around a run (issue
37, "Faults"): Flower's lines relayed without colour codes, a restarted node's refusal while
the coordinator still holds its previous session, and the end of a run at the node."""

from __future__ import annotations

import threading

from fed_auc.transport.flower.processes import follow_log, relay

# Flower 1.42's own lines, as `flwr run --stream` and the SuperLink write them to a pipe
COLOURED = [
    "\x1b[92mINFO \x1b[0m:      Starting logstream for run_id `11519777184962352223`\n",
    "\x1b[92mINFO \x1b[0m:      Start `flwr-serverapp` process\n",
    "\x1b[93mWARNING \x1b[0m:   Connection attempt failed, retrying in 0.33 seconds\n",
]
PLAIN = [
    "INFO :      Starting logstream for run_id `11519777184962352223`",
    "INFO :      Start `flwr-serverapp` process",
    "WARNING :   Connection attempt failed, retrying in 0.33 seconds",
]


def test_relayed_flower_lines_carry_no_colour_codes(tmp_path):
    shown: list[str] = []
    relay(iter(COLOURED), shown.append)  # the `flwr run` stream
    assert shown == PLAIN
    log = tmp_path / "superlink.log"  # a followed log, as the progress file is
    log.write_text("".join(COLOURED))
    done = threading.Event()
    done.set()
    followed: list[str] = []
    follow_log(log, followed.append, done)
    assert followed == PLAIN


SITES = ["st_elsewhere", "county_general"]
QUICK = {"model": "tiny", "rounds": 1, "local_steps": 1, "batch_size": 8, "image_size": 16,
         "transport": "flower"}  # fmt: skip
STARTED = "INFO :      Starting Flower SuperNode\n"
GONE = "WARNING :   Connection attempt failed, retrying in 0.33 seconds\n"  # its SuperLink
JOINED = "INFO :      SuperNode ID: 13481341554847947232\n"


def test_a_node_says_its_run_completed_and_not_that_the_coordinator_is_gone(tmp_path):
    """Over the node path (Flower's frames without Flower): at the end of a run every node
    says it ended, and the coordinator leaving afterwards is no fault on its console."""
    from fed_auc.site import SiteDefinition
    from fed_auc.store.run_store import RunStore
    from fed_auc.transport.flower import server
    from fed_auc.transport.flower.node_watch import SupernodeWatch
    from fed_auc.transport.flower.worker import NodeWorker
    from tests.support.flower_like import FlowerLikeTransport
    from tests.support.flower_worker import _site_toml

    files = [_site_toml(tmp_path, site, index) for index, site in enumerate(SITES)]
    consoles: dict[str, list[str]] = {site: [] for site in SITES}
    watches = {site: SupernodeWatch(site, "127.0.0.1:1") for site in SITES}  # nothing there
    workers = {
        site: NodeWorker(SiteDefinition.from_toml(path), consoles[site].append,
                         on_request=watches[site].heard)
        for site, path in zip(SITES, files, strict=True)
    }  # fmt: skip
    runs = tmp_path / "runs"
    config = {**QUICK, "runs_dir": str(runs)}
    with RunStore(runs) as store:
        run_id = store.create_run("codasca", config, None)
    flower = {"expected_sites": 2, "min_nodes": 2, "insecure": True}
    experiment = {"experiment": config, "flower": flower, "run_id": run_id}
    server.run_experiment(
        None, experiment, lambda line: None,
        lambda grid, setup, *rest: FlowerLikeTransport(files, setup, workers),
    )  # fmt: skip
    for site, lines in consoles.items():
        assert lines[-1] == (
            f"{site}: run {run_id} completed at the coordinator; this node waits for the "
            "next run (Ctrl-C stops it)"
        )
        watch = watches[site]
        assert watch.feed(STARTED + GONE) == []  # not "cannot reach ...: is it running?"
        assert watch.feed(STARTED + GONE * 3) == []
        # the next run's coordinator: a new SuperLink, which refuses the old session first
        watch.feed(STARTED + GONE * 3 + "ERROR :     ... 401 Unauthorized ...\n")
        assert watch.exited(1, tmp_path / "supernode.log") == ""
        assert watch.feed(STARTED + JOINED) == [
            f"{site}: connected to the coordinator at 127.0.0.1:1"
        ]
        assert watch.feed(STARTED + JOINED + GONE)[0].startswith(  # mid-run: a fault
            f"{site}: cannot reach 127.0.0.1:1"
        )
    # a run that ends, then another on the same coordinator (--leave-each-out): once that one
    # asks something, losing the coordinator is a fault again
    watch = SupernodeWatch("north", "127.0.0.1:1")
    watch.heard("end")
    watch.heard("register")
    assert watch.feed(STARTED + GONE)[0].startswith("north: cannot reach 127.0.0.1:1")


# Flower 1.42's SuperNode log when the SuperLink refuses to activate it: for a key it does not
# know and for a key whose previous session it still holds alike
REFUSED = """\
ERROR :     Exit Code: 305
Failed to initialize the connection to the SuperLink.
[code: 2004] Failed to activate SuperNode.
The SuperNode could not establish a connection to the SuperLink.
"""
ADDRESS = "127.0.0.1:9092"


def test_a_refusal_of_a_node_that_joined_before_says_its_session_is_still_held():
    from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL, HEARTBEAT_PATIENCE

    from fed_auc.transport.flower.node_watch import SESSION_HELD_S, explain

    assert SESSION_HELD_S == HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL  # Flower's
    assert explain(STARTED + REFUSED, ADDRESS, rejoining=True) == (
        f"the coordinator at {ADDRESS} does not let this node in yet (it still holds this "
        "node's previous session; it is released within ~60 s)"
    )
    assert explain(STARTED + REFUSED, ADDRESS).startswith("this key is not registered")


def test_a_restarted_node_hears_its_session_is_held_before_that_its_key_is_unknown(tmp_path):
    from fed_auc.transport.flower.node_watch import (
        JOINED_FILE,
        REJOIN_PATIENCE_S,
        Joined,
        SupernodeWatch,
    )

    log = tmp_path / "supernode.log"
    first = SupernodeWatch("north", ADDRESS, None, tmp_path, "SHA256:abc")
    first.feed(STARTED + JOINED)  # it joined: the record says where and with which key
    assert Joined.read(tmp_path) == Joined(ADDRESS, "SHA256:abc")
    assert (tmp_path / JOINED_FILE).exists()

    watch = SupernodeWatch("north", ADDRESS, None, tmp_path, "SHA256:abc")  # restarted
    watch.feed(STARTED + REFUSED)
    assert watch.exited(1, log) == (
        f"north: the coordinator at {ADDRESS} does not let this node in yet (it still holds "
        "this node's previous session; it is released within ~60 s); retrying"
    )
    watch.feed(STARTED + REFUSED)
    assert watch.exited(1, log) == ""  # once, not at every retry
    watch.refused_since -= REJOIN_PATIENCE_S + 1  # refused for longer than a session is held
    watch.feed(STARTED + REFUSED)
    assert watch.exited(1, log).startswith("north: this key is not registered at the coordinator")
    watch.feed(STARTED + JOINED)
    watch.feed(STARTED + JOINED + REFUSED)  # joined again: a new patience
    assert "does not let this node in yet" in watch.exited(1, log)

    for other in (  # another key, or another coordinator: the key is not registered there
        SupernodeWatch("north", ADDRESS, None, tmp_path, "SHA256:other"),
        SupernodeWatch("north", "10.0.0.9:9092", None, tmp_path, "SHA256:abc"),
        SupernodeWatch("north", ADDRESS, None, tmp_path / "never_joined", "SHA256:abc"),
    ):
        other.feed(STARTED + REFUSED)
        assert "registers its sites' keys just after it starts" in other.exited(1, log)
        other.refused_since -= 31  # refused for longer than a starting coordinator takes
        other.feed(STARTED + REFUSED)
        assert "this key is not registered" in other.exited(1, log)


def test_a_node_refused_at_a_coordinators_start_is_not_told_its_key_is_unknown(tmp_path):
    from fed_auc.transport.flower.node_watch import STARTUP_PATIENCE_S, SupernodeWatch, explain

    assert explain(STARTED + REFUSED, ADDRESS, starting=True) == (
        f"the coordinator at {ADDRESS} does not let this node in yet (a coordinator registers "
        f"its sites' keys just after it starts; still refused after {STARTUP_PATIENCE_S:g} s "
        "means this key is not registered there)"
    )
    log = tmp_path / "supernode.log"
    watch = SupernodeWatch("north", ADDRESS, None, tmp_path, "SHA256:abc")  # never joined
    watch.feed(STARTED + REFUSED)
    assert "does not let this node in yet" in watch.exited(1, log)
    watch.feed(STARTED + REFUSED)
    assert watch.exited(1, log) == ""  # once, not at every retry
    watch.feed(STARTED + REFUSED + JOINED)  # the coordinator registered the key: it joins
    assert watch.refused_since is None
    watch.feed(STARTED + REFUSED)  # a later refusal has a new patience
    assert "does not let this node in yet" in watch.exited(1, log)


def test_the_joined_record_names_the_key_as_the_coordinator_knows_it(tmp_path):
    from fed_auc.transport.flower.certs import make_certs
    from fed_auc.transport.flower.identity import fingerprint, key_file_fingerprint

    keys = make_certs(tmp_path / "certs", ["north"]) / "keys"
    assert key_file_fingerprint(keys / "north.key") == fingerprint((keys / "north.pub").read_text())
    (tmp_path / "garbage.key").write_text("not a key\n")
    assert key_file_fingerprint(tmp_path / "garbage.key") is None
