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
                         on_end=watches[site].run_ended)
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
        assert watch.feed(STARTED + GONE * 3 + JOINED) == [  # the next run's coordinator
            f"{site}: connected to the coordinator at 127.0.0.1:1"
        ]
        assert watch.feed(STARTED + GONE * 3 + JOINED + GONE)[0].startswith(  # mid-run: a fault
            f"{site}: cannot reach 127.0.0.1:1"
        )
