"""Personalization (LSGD-PFL head, Ditto-style l2): what stays home, what is reported."""

from __future__ import annotations

import pytest
import torch

from fed_auc.algorithms import build_backend
from fed_auc.algorithms.personal import Personalization
from fed_auc.cli import main
from fed_auc.data.synthetic import make_synthetic_federation
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import load_state, load_torch
from fed_auc.losses import build_loss
from fed_auc.models import build_model
from fed_auc.node.node import LocalTraining, Node
from fed_auc.node.setup import NodeSetup
from fed_auc.simulation import build_federation, run_simulation
from fed_auc.store.run_store import RunStore
from fed_auc.trainable import Trainable
from fed_auc.transport.local import LocalTransport

TINY = {"arch": "tiny", "num_labels": 1, "in_channels": 1}
SMALL = {"sites": 3, "rounds": 2, "local_steps": 2, "batch_size": 8, "data_scale": 0.15}
HEAD = {"w/net.class_layers.out.weight", "w/net.class_layers.out.bias"}


def _personal_key(key: str) -> bool:
    base = key.split("/", 1)[1] if key.startswith(("dc/", "g/", "mean/")) else key
    return base in HEAD or base.startswith("auc/")


@pytest.mark.parametrize("algorithm", ["codasca", "fed_norm_sgda"])
def test_head_replies_never_carry_personal_tensors_and_auc_is_reported(
    tmp_path, monkeypatch, algorithm
):
    sent = []
    train = LocalTransport.train

    def spy(self, requests):
        answers = train(self, requests)
        sent.extend(answers.values())
        return answers

    monkeypatch.setattr(LocalTransport, "train", spy)
    config = ExperimentConfig(
        algorithm=algorithm, personalize="head", runs_dir=str(tmp_path), **SMALL
    )
    summary = run_simulation(config)
    assert len(sent) == 6
    for reply in sent:
        assert reply.tensors and not [k for k in reply.tensors if _personal_key(k)]
    exported = load_torch(summary["model_path"])["state_dict"]["net.class_layers.out.weight"]
    config.runs_dir = str(tmp_path / "again")
    fresh = build_federation(config)
    initial = fresh.coordinator.state["model"]["w/net.class_layers.out.weight"]
    fresh.coordinator.close()
    fresh.store.close()
    assert torch.equal(exported, initial)  # the server never saw a head: it is the initial one
    with RunStore(tmp_path) as store:
        rows = store.site_rounds(summary["run_id"])
    trained = rows[rows["round"] > 0]
    assert trained["personal_auc"].notna().all() and trained["auc"].notna().all()
    assert trained["personal_auc_lo"].le(trained["personal_auc"]).all()
    assert (trained["personal_auc"] != trained["auc"]).any()
    for site in summary["site_auc"]:  # the head lives in the node's local state file
        local = load_state(tmp_path / summary["run_id"] / "nodes" / site / "local_state.pt")
        assert set(local["personal"]["tensors"]) == HEAD | {"auc/a", "auc/b", "auc/alpha"}


def test_an_empty_personal_part_is_the_plain_backend_exactly(tmp_path, monkeypatch):
    plain = run_simulation(ExperimentConfig(runs_dir=str(tmp_path / "plain"), **SMALL))
    empty = Personalization("head", head_groups=(), auc_personal=False, lr_ratio=3.0)
    monkeypatch.setattr(NodeSetup, "personalization", lambda self: empty)
    personal = run_simulation(ExperimentConfig(runs_dir=str(tmp_path / "empty"), **SMALL))
    assert personal["global_auc"] == plain["global_auc"]
    a, b = load_torch(plain["model_path"]), load_torch(personal["model_path"])
    for name, tensor in a["state_dict"].items():
        assert torch.equal(tensor, b["state_dict"][name]), name
    assert a["auc"] == b["auc"]


@pytest.fixture(scope="module")
def site():
    return make_synthetic_federation(num_sites=1, image_size=28, seed=5, scale=0.2)[0]


def _l2_distance(tmp_path, site, lam: float) -> float:
    """‖β − w‖ after one round of l2 personal steps from a personal model far from w."""
    backend = build_backend("local_sgda", local_steps=4, lr=0.1)
    personal = Personalization("l2", lam=lam)
    training = LocalTraining(TINY, "auc_margin", batch_size=8, personalization=personal)
    node = Node(site, backend, training, tmp_path / str(lam))
    torch.manual_seed(1)
    server = Trainable(build_model("tiny"), build_loss("auc_margin", 1, [0.3]))
    state = backend.init_server(server, {site.name: len(site.train)})
    broadcast = backend.plan(state, 0)
    broadcast.config["pos_ratio"] = [0.3]
    start = {n: t + 0.5 for n, t in broadcast.tensors.items()}  # a personal model elsewhere
    node._local_state = {}  # a node that has trained before, with this personal model
    node._personal = {"tensors": start}
    node.train(broadcast)
    beta = node._personal["tensors"]
    names = [n for n in broadcast.tensors if not n.startswith("buf/")]
    return float(torch.cat([(beta[n] - broadcast.tensors[n]).flatten() for n in names]).norm())


def test_l2_personal_model_tracks_the_global_one_as_lambda_grows(tmp_path, site):
    distances = [_l2_distance(tmp_path, site, lam) for lam in (0.0, 1.0, 100.0, 1e9)]
    assert distances[0] > distances[1] > distances[2] > distances[3]
    assert distances[0] > 1.0 and distances[3] < 1e-5


def test_personal_model_survives_a_node_restart(tmp_path, site):
    backend = build_backend("codasca", local_steps=2)
    personalization = Personalization("head", lr_ratio=2.0)

    def node() -> Node:
        training = LocalTraining(TINY, "auc_margin", batch_size=8, personalization=personalization)
        return Node(site, backend, training, tmp_path)

    first = node()
    assert first.trainable.grad_scale == {n: 2.0 for n in HEAD | {"auc/a", "auc/b", "auc/alpha"}}
    torch.manual_seed(2)
    server = Trainable(build_model("tiny"), build_loss("auc_margin", 1, [0.3]))
    state = backend.init_server(server, {site.name: len(site.train)})
    broadcast = backend.plan(state, 0)
    broadcast.config["pos_ratio"] = [0.3]
    assert first.evaluate(state["model"]).personal is None  # no personal model yet
    first.train(broadcast)
    before = first.evaluate(state["model"]).personal["test"].aucs[0].auc
    after = node().evaluate(state["model"]).personal["test"].aucs[0].auc  # a fresh process
    assert after == before


def test_personalization_options_are_validated(tmp_path):
    with pytest.raises(ValueError, match="personalize must be one of"):
        ExperimentConfig(personalize="body")
    with pytest.raises(ValueError, match="personal_lambda"):
        ExperimentConfig(personalize="l2", personal_lambda=-1.0)
    with pytest.raises(ValueError, match="does not compose with fedsgda_mb"):
        ExperimentConfig(personalize="head", algorithm="fedsgda_mb")


@pytest.mark.slow
def test_cli_l2_runs_with_fedsgda_and_records_personal_auc(tmp_path):
    config = tmp_path / "small.toml"
    config.write_text("data_scale = 0.15\n")
    args = ["simulate", "--config", str(config), "--personalize", "l2", "--personal-lambda"]
    args += ["0.5", "--algorithm", "fedsgda_mb", "--sites", "3", "--rounds", "2"]
    main([*args, "--local-steps", "2", "--batch-size", "8", "--runs-dir", str(tmp_path)])
    with RunStore(tmp_path) as store:
        rows = store.site_rounds(store.runs()["id"].iloc[0])
    assert rows[rows["round"] > 0]["personal_auc"].notna().all()
