"""A run's setup is fixed at its first release: the coordinator cannot re-key a release.

Each test plays the coordinator with what it holds (the run's setup, its broadcasts) and what
the protocol lets it ask (any setup with any request). It asks a round the node already
answered again, changing one thing the release key used to leave out (image size, the model's
input normalization, a synthetic site's seed, data scale, label count, the data, δ): on the
old node that was the same key, the same noise and a noise-free difference of two replies;
now it is refused by name and the ledger is untouched. A run id that is a path is refused
before the node writes anything outside its state directory. Both in-process (``build_node``)
and through the Flower node path (``NodeWorker``, the setup arriving over the wire).
"""

from __future__ import annotations

import dataclasses
import json
import stat
from pathlib import Path

import pytest

from fed_auc.exchange import Broadcast, refusal
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.models import build_model
from fed_auc.node.build import build_node
from fed_auc.node.setup import NodeSetup, SiteHosting
from fed_auc.privacy.accounting import LEDGER_FILE, SECRET_FILE, SetupChanged
from fed_auc.privacy.run_setup import RUN_SETUP_FILE
from fed_auc.site import SiteDefinition
from fed_auc.transport.flower.codec import broadcast_frame, frame_reply
from fed_auc.transport.flower.worker import NodeWorker
from tests.support.dp import tiny_site
from tests.support.flower_worker import SMALL, _setup, _site_toml

UPDATE_DP = {"dp_clip": 1.0, "dp_noise": 0.5}
EXAMPLE_DP = {"dp": "example", "dp_clip": 1.0, "dp_noise": 2.0}
# One change per field the old release key left out (the attack's five, and δ).
CHANGES = {
    "image_size": lambda s: {**s, "image_size": s["image_size"] * 2},
    "model_config.input": lambda s: {
        **s, "model_config": {**s["model_config"], "input": "imagenet"}
    },
    "seed": lambda s: {**s, "seed": s["seed"] + 1},
    "data_scale": lambda s: {**s, "data_scale": s["data_scale"] / 2},
    "num_labels": lambda s: {**s, "num_labels": s["num_labels"] + 1},
    "update_dp.delta": lambda s: {**s, "update_dp": {**s["update_dp"], "delta": 1e-3}},
}  # fmt: skip


def _named(field: str) -> str:
    """How the refusal names the change (δ: by the ledger, before the node is built)."""
    return (
        "δ = 1e-05; a request at δ = 0.001" if field == "update_dp.delta" else f"changes .*{field}"
    )


# -- in-process ------------------------------------------------------------------------------
def _setup_in_process(dp: dict) -> NodeSetup:
    config = ExperimentConfig(
        model="tiny", image_size=16, batch_size=8, algorithm="local_sgda", local_steps=1, **dp
    )
    return config.node_setup("run1", build_model("tiny", norm="group").config(), 1, 1)


def _node(setup: NodeSetup, state: Path, data=None):
    hosting = SiteHosting("hospital_a", 0)
    return build_node(setup, data or tiny_site(), hosting, state)


def _request(node, round_: int = 0) -> Broadcast:
    config = {"pos_ratio": [0.25], "lr": 0.1, "local_steps": 1, "commit": None, "continue": None}
    return Broadcast(round_, "train", node.trainable.tensors(), config)


@pytest.mark.parametrize("field", list(CHANGES))
def test_the_same_round_with_a_changed_setup_is_refused_in_process(tmp_path, field):
    setup = _setup_in_process(UPDATE_DP)
    node = _node(setup, tmp_path)
    request = _request(node)
    node.train(request)
    ledger = (tmp_path / LEDGER_FILE).read_bytes()
    for private in (LEDGER_FILE, RUN_SETUP_FILE):  # only the node's user reads them
        assert stat.S_IMODE((tmp_path / private).stat().st_mode) == 0o600
    changed = NodeSetup.from_dict(CHANGES[field](setup.to_dict()))
    with pytest.raises(SetupChanged, match=_named(field)) as refused:
        _node(changed, tmp_path).train(request)  # the node a resumed run would build
    assert refused.value.status == "setup_changed"
    assert (tmp_path / LEDGER_FILE).read_bytes() == ledger  # nothing counted, nothing sent
    assert _node(setup, tmp_path).train(request).metrics["dp_epsilon"] > 0  # same setup: fine


def test_the_same_round_on_other_data_is_refused(tmp_path):
    """Same setup, other images (a site file pointed elsewhere): another digest, refused."""
    setup = _setup_in_process(EXAMPLE_DP)
    node = _node(setup, tmp_path)
    request = _request(node)
    node.train(request)
    other = tiny_site()
    other.train.images[0] += 0.5
    with pytest.raises(SetupChanged, match="changes data"):
        _node(setup, tmp_path, other).train(request)
    fixed = json.loads((tmp_path / RUN_SETUP_FILE).read_text())
    assert fixed["setup"] == json.loads(json.dumps(setup.to_dict()))
    assert (tmp_path / RUN_SETUP_FILE).stat().st_mode & 0o077 == 0  # the node's user only


def test_resuming_with_another_delta_is_refused_and_the_ledger_keeps_its_epsilon(tmp_path):
    """The old node rewrote the ledger's δ, so past releases reported a smaller ε."""
    setup = _setup_in_process(UPDATE_DP)
    node = _node(setup, tmp_path)
    for round_ in range(2):
        spent = node.train(_request(node, round_)).metrics["dp_epsilon"]
    ledger = (tmp_path / LEDGER_FILE).read_bytes()
    assert node.privacy.spent() == (pytest.approx(spent), setup.update_dp["delta"])
    larger = CHANGES["update_dp.delta"](setup.to_dict())
    with pytest.raises(SetupChanged, match=r"δ = 1e-05; a request at δ = 0.001 is refused"):
        _node(NodeSetup.from_dict(larger), tmp_path)
    assert (tmp_path / LEDGER_FILE).read_bytes() == ledger
    assert _node(setup, tmp_path).privacy.spent()[0] == pytest.approx(spent)


def test_each_mode_answers_the_same_contract_and_says_what_it_spent(tmp_path):
    """No DP, update DP and DP-SGD behind one object: its mode and the site's (ε, δ)."""
    spent = {}
    for mode, dp in (("none", {}), ("update", UPDATE_DP), ("example", EXAMPLE_DP)):
        node = _node(_setup_in_process(dp), tmp_path / mode)
        assert node.privacy.mode == mode
        reply = node.train(_request(node))
        spent[mode] = node.privacy.spent()
        if dp:
            assert spent[mode] == (pytest.approx(reply.metrics["dp_epsilon"]), 1e-5)
    assert spent["none"] is None


# -- run ids ---------------------------------------------------------------------------------
@pytest.mark.parametrize("run_id", ["../x", "ABS", "a/b", "", "..", "x\0y"])
def test_a_run_id_that_is_a_path_is_refused_before_anything_is_written(tmp_path, run_id):
    run_id = str(tmp_path / "abs") if run_id == "ABS" else run_id
    path = _site_toml(tmp_path / "site", "mercy_rural", 2)
    worker = NodeWorker(SiteDefinition.from_toml(path))
    setup, _ = _setup_over_flower(UPDATE_DP)
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(ValueError, match="run id = .*letters, digits"):
        worker.handle({"kind": "register", "setup": {**setup, "run_id": run_id}}, [])
    assert sorted(tmp_path.rglob("*")) == before  # no state, no secret, no ledger anywhere
    assert not list(tmp_path.rglob(SECRET_FILE))
    with pytest.raises(ValueError, match="run id"):  # wherever a setup is made
        dataclasses.replace(_setup_in_process({}), run_id=run_id)


# -- over the Flower node path ---------------------------------------------------------------
def _setup_over_flower(dp: dict) -> tuple[dict, Broadcast]:
    setup, broadcast = _setup()
    broadcast.config.update({"commit": None, "continue": None})  # asked again: same state
    config = ExperimentConfig(**SMALL, **dp)
    values = dataclasses.asdict(config.update_dp()) if config.update_dp() else None
    return {**setup, "update_dp": values}, broadcast


def test_the_same_round_with_a_changed_setup_is_refused_over_the_flower_node_path(tmp_path):
    setup, broadcast = _setup_over_flower(UPDATE_DP)
    site = SiteDefinition.from_toml(_site_toml(tmp_path, "mercy_rural", 2))
    console: list[str] = []
    worker = NodeWorker(site, echo=console.append)
    first = frame_reply(worker.handle(*broadcast_frame(broadcast, setup)))
    assert first.metrics["dp_epsilon"] > 0
    state = site.state_dir / "run1"
    ledger = (state / LEDGER_FILE).read_bytes()
    for field, change in CHANGES.items():
        with pytest.raises(SetupChanged, match=_named(field)) as refused:
            worker.handle(*broadcast_frame(broadcast, change(setup)))
        assert refusal(refused.value).startswith("refused[setup_changed]: ")
        assert console[-1].startswith("mercy_rural: refused a train request: "), field
        assert (state / LEDGER_FILE).read_bytes() == ledger, field
    again = frame_reply(worker.handle(*broadcast_frame(broadcast, setup)))  # the same: free
    assert again.metrics["dp_epsilon"] == first.metrics["dp_epsilon"]
    assert (state / LEDGER_FILE).read_bytes() == ledger
