"""Hostile or broken replies are rejected with an event and never averaged; the run goes on."""

from __future__ import annotations

import pytest
import torch

from fed_auc.data.synthetic import DEFAULT_PROFILES
from fed_auc.experiment import ExperimentConfig
from fed_auc.io import load_torch
from fed_auc.node import Node
from fed_auc.simulation import run_simulation
from fed_auc.store import RunStore

SMALL = {"sites": 3, "rounds": 2, "local_steps": 2, "batch_size": 8, "data_scale": 0.15}
BAD = DEFAULT_PROFILES[1].name
OTHER = DEFAULT_PROFILES[0].name


def first_weight(reply) -> str:
    return next(n for n in reply.tensors if n.startswith("w/"))


def nan(reply):
    reply.tensors[first_weight(reply)] = torch.full_like(reply.tensors[first_weight(reply)], 1e0)
    reply.tensors[first_weight(reply)][0] = float("nan")


def inf(reply):
    reply.tensors["auc/a"] = torch.full_like(reply.tensors["auc/a"], float("inf"))


def renamed(reply):
    reply.tensors["w/evil"] = reply.tensors.pop(first_weight(reply))


def reshaped(reply):
    name = first_weight(reply)
    reply.tensors[name] = reply.tensors[name].flatten()[:-1]


def retyped(reply):
    name = first_weight(reply)
    reply.tensors[name] = reply.tensors[name].half()


def oversized(reply):
    reply.tensors["w/padding"] = torch.zeros(5_000_000)


def absurd_norm(reply):
    for name in [n for n in reply.tensors if n.startswith("w/")]:
        reply.tensors[name] = reply.tensors[name] * 1e6


def impostor(reply):
    reply.site = OTHER


def stale(reply):
    reply.round = reply.round - 1


TAMPERINGS = {
    "nan": (nan, "contains NaN or infinite values"),
    "inf": (inf, "'auc/a' contains NaN or infinite"),
    "wrong name": (renamed, "missing tensor"),
    "wrong shape": (reshaped, "has shape"),
    "wrong dtype": (retyped, "has dtype torch.float16, expected torch.float32"),
    "oversized": (oversized, "oversized or malformed payload"),
    "absurd norm": (absurd_norm, "exceeds the bound"),
    "duplicated site id": (impostor, f"claims to come from site '{OTHER}'"),
    "wrong round": (stale, "phase 'train', but round"),
}


def run(tmp_path, monkeypatch, change) -> dict:
    original = Node.train

    def train(self, broadcast):
        if self.name != BAD:
            return original(self, broadcast)
        return change(self, broadcast, original)

    monkeypatch.setattr(Node, "train", train)
    config = ExperimentConfig(runs_dir=str(tmp_path), max_update_norm=1e3, **SMALL)
    return run_simulation(config)


@pytest.fixture(scope="module")
def excluded(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The reference: the same run where the bad site's node fails outright every round."""
    monkeypatch = pytest.MonkeyPatch()

    def fail(self, broadcast, original):
        raise RuntimeError("node down")

    try:
        summary = run(tmp_path_factory.mktemp("excluded"), monkeypatch, fail)
    finally:
        monkeypatch.undo()
    return load_torch(summary["model_path"])["state_dict"]


@pytest.mark.parametrize("kind", list(TAMPERINGS))
def test_hostile_reply_is_rejected_recorded_and_never_averaged(
    tmp_path, monkeypatch, excluded, kind
) -> None:
    tamper, message = TAMPERINGS[kind]

    def hostile(self, broadcast, original):
        reply = original(self, broadcast)
        tamper(reply)
        return reply

    summary = run(tmp_path, monkeypatch, hostile)
    with RunStore(tmp_path) as store:
        rows = store.site_rounds(summary["run_id"])
        statuses = rows[(rows["site"] == BAD) & (rows["round"] > 0)]["status"]
        assert set(statuses) == {"rejected"}
        events = store.events(summary["run_id"])
        rejected = events[events["site"] == BAD]["message"]
        assert len(rejected) == 2 and rejected.str.contains(message, regex=False).all(), rejected
        assert store.run(summary["run_id"])["status"] == "completed"
    model = load_torch(summary["model_path"])["state_dict"]
    for name, tensor in excluded.items():  # as if the site had not answered at all
        assert torch.equal(model[name], tensor), name


def test_an_answer_that_is_not_a_reply_is_rejected(tmp_path, monkeypatch) -> None:
    summary = run(tmp_path, monkeypatch, lambda self, b, original: {"w/x": "payload"})
    with RunStore(tmp_path) as store:
        events = store.events(summary["run_id"])
        assert events["message"].str.contains("is a dict, not a Reply").sum() == 2
