"""Robust aggregation: coordinate-wise median / trimmed mean, exact on hand-built replies."""

from __future__ import annotations

import pytest
import torch

from fed_auc.algorithms.base import Reply
from fed_auc.experiment import ExperimentConfig
from fed_auc.io import load_torch
from fed_auc.robust import Aggregation
from fed_auc.simulation import run_simulation


def replies(*values: list[float]) -> list[Reply]:
    return [
        Reply({"w/x": torch.tensor(v), "buf/n": torch.tensor([3])}, steps=1, num_examples=1)
        for v in values
    ]


def test_median_and_trimmed_mean_by_hand() -> None:
    given = replies([1.0, 10.0], [2.0, -5.0], [100.0, 0.0], [3.0, 1.0])
    median = Aggregation("median").apply(given)
    assert all(torch.equal(r.tensors["w/x"], torch.tensor([2.5, 0.5])) for r in median)
    trimmed = Aggregation("trimmed_mean", 0.25).apply(given)  # drop 1 low and 1 high
    assert torch.equal(trimmed[0].tensors["w/x"], torch.tensor([2.5, 0.5]))
    odd = Aggregation("median").apply(given[:3])
    assert torch.equal(odd[2].tensors["w/x"], torch.tensor([2.0, 0.0]))
    assert torch.equal(median[0].tensors["buf/n"], torch.tensor([3]))  # counts untouched
    assert Aggregation("mean").apply(given) == given
    two = Aggregation("median").apply(given[:2])  # too few for a median: as they are
    assert torch.equal(two[0].tensors["w/x"], given[0].tensors["w/x"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mode", "must be one of"),
        ("median:0.2", "takes no parameter"),
        ("trimmed_mean:0.6", "β in"),
        ("trimmed_mean:x", "look like"),
    ],
)
def test_bad_aggregation_is_refused(text, message) -> None:
    with pytest.raises(ValueError, match=message):
        Aggregation.parse(text)
    assert Aggregation.parse("trimmed_mean:0.2") == Aggregation("trimmed_mean", 0.2)


def test_median_keeps_a_large_but_finite_attack_out_of_the_model(tmp_path, monkeypatch) -> None:
    from fed_auc.data.synthetic import DEFAULT_PROFILES
    from fed_auc.node import Node

    original, bad = Node.train, DEFAULT_PROFILES[0].name

    def attack(self, broadcast):
        reply = original(self, broadcast)
        if self.name == bad:  # every weight pushed far away: finite, under no norm bound
            reply.tensors = {
                n: t + 50.0 if n.startswith("w/") else t for n, t in reply.tensors.items()
            }
        return reply

    monkeypatch.setattr(Node, "train", attack)
    models = {}
    for method in ("mean", "median"):
        config = ExperimentConfig(
            runs_dir=str(tmp_path / method),
            algorithm="local_sgda",  # codasca and coda_plus refuse robust aggregation
            sites=4,
            rounds=2,
            local_steps=2,
            data_scale=0.15,
            aggregation=method,
        )
        models[method] = load_torch(run_simulation(config)["model_path"])["state_dict"]
    weight = next(n for n in models["mean"] if n.endswith("conv0.weight"))
    assert float(models["mean"][weight].abs().mean()) > 10  # the mean took the attack in
    assert float(models["median"][weight].abs().mean()) < 1  # the median did not


def test_codasca_and_coda_plus_refuse_robust_aggregation_by_name_with_the_reason(tmp_path):
    reasons = {"codasca": "its control variates", "coda_plus": "a coordinate-wise median"}
    for algorithm, reason in reasons.items():
        for method in ("median", "trimmed_mean:0.2"):
            with pytest.raises(ValueError, match=f"with '{algorithm}': {reason}"):
                ExperimentConfig(runs_dir=str(tmp_path), algorithm=algorithm, aggregation=method)
        ExperimentConfig(runs_dir=str(tmp_path), algorithm=algorithm, aggregation="mean")
