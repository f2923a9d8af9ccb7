"""A site taken over, tried for real: a SuperLink, three hospitals' nodes and a fourth node
with a valid (registered) key that says it is a site that already joined.

The coordinator waits for three sites; two join, then the impostor claims the first of them
while the third is not there yet, so its claim meets a site already joined. It must be
refused and recorded as an impersonation attempt naming both keys, never asked to train,
and the run must complete with the three real sites, their keys kept in the run's record.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fed_auc.node.node import LOCAL_STATE_FILE, PENDING_STATE_FILE
from fed_auc.store.run_store import RunStore
from fed_auc.transport.flower.certs import make_certs
from fed_auc.transport.flower.identity import read_site_keys
from fed_auc.transport.flower.processes import free_port
from tests.support.flower_loopback import SITES, _site_toml
from tests.support.processes import start_fed_auc, stop_all, wait_for_line

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SPARE = "spare"  # a key the coordinator registers, of no site that runs
EXPERIMENT = {"rounds": 2, "local_steps": 2, "batch_size": 8}


def test_a_node_with_another_valid_key_cannot_take_a_joined_sites_place(tmp_path):
    make_certs(tmp_path / "certs", [*SITES, SPARE])
    prints = read_site_keys(tmp_path / "certs" / "keys")
    port = free_port()
    victim, late = SITES[0], SITES[-1]
    (tmp_path / "impostor").mkdir()
    impostor_file = _site_toml(tmp_path / "impostor", victim)  # the victim's name, its own state

    def node(site_file: Path, key: str, log: str):
        args = ["node", "--site", str(site_file), "--coordinator", f"127.0.0.1:{port}"]
        args += ["--root-certificates", "certs/ca.pem", "--auth-key", f"certs/keys/{key}.key"]
        return start_fed_auc(tmp_path, *args, log=tmp_path / log)

    options = [f"{k} = {json.dumps(v)}" for k, v in {**EXPERIMENT, "runs_dir": "runs"}.items()]
    flower = {"address": f"127.0.0.1:{port}", "expected_sites": 3, "min_nodes": 3,
              "register_timeout_s": 600, "certs_dir": "certs"}  # fmt: skip
    options += ["[flower]"] + [f"{k} = {json.dumps(v)}" for k, v in flower.items()]
    (tmp_path / "experiment.toml").write_text("\n".join(options) + "\n")
    log = tmp_path / "coordinator.log"
    processes = [node(_site_toml(tmp_path, s), s, f"{s}.log") for s in SITES[:-1]]
    coordinator = start_fed_auc(
        tmp_path, "coordinator", "--config", "experiment.toml", "--json", log=log, session=True
    )
    processes.append(coordinator)
    try:
        wait_for_line(log, f"site {victim} joined", coordinator, timeout=400)
        processes.append(node(impostor_file, SPARE, "impostor.log"))
        wait_for_line(log, "impersonation attempt", coordinator, timeout=400)
        processes.append(node(_site_toml(tmp_path, late), late, f"{late}.log"))
        assert coordinator.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        stop_all(processes)
    text = log.read_text()
    summary = json.loads(text[text.index('{\n  "run_id"') :])
    run_id = summary["run_id"]
    assert sorted(summary["sites"]) == sorted(SITES)
    with RunStore(tmp_path / "runs") as store:
        run = store.run(run_id)
        events = store.events(run_id)
        rows = store.site_rounds(run_id)
    assert run["status"] == "completed"
    assert run["config"]["site_keys"] == {site: prints[site] for site in SITES}
    refused = events[events["message"].str.contains("impersonation attempt")]
    assert refused["level"].tolist() == ["error"] and refused["site"].tolist() == [victim]
    message = refused["message"].iloc[0]
    assert prints[SPARE] in message and prints[victim] in message
    trained = rows[(rows["site"] == victim) & (rows["round"] > 0)]
    assert (trained["status"] == "completed").all() and len(trained) == EXPERIMENT["rounds"]
    # The victim's own node trained; the impostor, asked only who it is, never did.
    real = tmp_path / "nodes" / victim / run_id
    assert (real / LOCAL_STATE_FILE).exists() or (real / PENDING_STATE_FILE).exists()
    fake = tmp_path / "impostor" / "nodes" / victim / run_id
    assert not (fake / LOCAL_STATE_FILE).exists() and not (fake / PENDING_STATE_FILE).exists()
