"""The request host: a site answers the same whichever transport carries the request."""

from __future__ import annotations

import dataclasses

import pytest

from fed_auc.experiment.config import ExperimentConfig
from fed_auc.simulation import build_federation
from fed_auc.site import SiteDefinition
from fed_auc.transport.flower.worker import NodeWorker
from tests.support.flower_worker import SMALL, _setup, _site_toml


def test_a_site_file_registers_the_same_fields_in_process_and_over_flower(tmp_path):
    """One site file with its own τ_i and memory budget: ``fed-auc simulate`` and
    ``fed-auc node`` register it with the same fields and values."""
    path = _site_toml(tmp_path / "files", "mercy_rural", 2, local_steps=3, memory_budget=0.5)
    worker = NodeWorker(SiteDefinition.from_toml(path))
    setup, _ = _setup()
    flower = worker.handle({"kind": "register", "setup": setup}, [])[0]["registration"]
    config = ExperimentConfig(**{**SMALL, "sites": 1}, site_files=[str(path)],
                              runs_dir=str(tmp_path / "runs"))  # fmt: skip
    federation = build_federation(config)
    in_process = federation.coordinator.transport.register()["mercy_rural"]
    federation.store.close()
    assert in_process == flower
    assert flower["local_steps"] == 3 and flower["memory_budget"] == 0.5
    assert flower["order"] == [2, "mercy_rural"] and flower["synthetic"] is True


def test_a_stale_train_request_is_refused_in_process_too(tmp_path):
    """A request for a round before the last one trained would overwrite the later reply's
    pending state: the host refuses it whichever transport delivered it."""
    path = _site_toml(tmp_path / "files", "mercy_rural", 2)
    config = ExperimentConfig(**{**SMALL, "sites": 1}, site_files=[str(path)],
                              runs_dir=str(tmp_path / "runs"))  # fmt: skip
    federation = build_federation(config)
    transport = federation.coordinator.transport
    host = transport.hosts["mercy_rural"]
    _, broadcast = _setup()
    later = dataclasses.replace(broadcast, round=1)
    host.train(later)
    with pytest.raises(ValueError, match="stale request for round 1"):
        host.train(broadcast)
    failure = transport.train({"mercy_rural": broadcast})["mercy_rural"]
    federation.store.close()
    assert failure.status == "error" and "stale request" in failure.message


def test_the_sites_own_local_steps_win_and_the_callers_request_stays_as_sent(tmp_path):
    """A site file's τ_i = 3 against a request for another count: the node runs 3 steps, and
    the request object the caller holds (in-process, the coordinator's own) is not altered."""
    path = _site_toml(tmp_path / "files", "mercy_rural", 2, local_steps=3)
    config = ExperimentConfig(**{**SMALL, "sites": 1}, site_files=[str(path)],
                              runs_dir=str(tmp_path / "runs"))  # fmt: skip
    federation = build_federation(config)
    host = federation.coordinator.transport.hosts["mercy_rural"]
    _, broadcast = _setup()
    asked = {**broadcast.config, "local_steps": 1}
    request = dataclasses.replace(broadcast, config=dict(asked))
    reply = host.train(request)
    federation.store.close()
    assert reply.steps == 3
    assert request.config == asked
