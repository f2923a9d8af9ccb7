"""Partial model training (EmbracingFL): budgets, measured memory, frozen prefix, averaging."""

from __future__ import annotations

import json

import pytest
import torch

from fed_auc.algorithms import ALGORITHMS, build_backend
from fed_auc.algorithms.base import weighted_mean
from fed_auc.algorithms.codasca import CONTROL_DELTA
from fed_auc.algorithms.local_sgda import LocalSGDA
from fed_auc.algorithms.partial import (
    MemoryBudget,
    StepMemory,
    choose_groups,
    measure_step,
    memory_table,
    parse_budget,
    trained_part,
)
from fed_auc.cli import main
from fed_auc.coordinator.screening import InvalidReply, validate_reply
from fed_auc.data.synthetic import make_synthetic_federation
from fed_auc.exchange import Reply
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import load_torch
from fed_auc.losses import build_loss
from fed_auc.models import build_model, group_of
from fed_auc.node.node import LocalTraining, Node
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore
from fed_auc.trainable import Trainable

TINY = {"arch": "tiny", "num_labels": 1, "in_channels": 1}
SMALL = {"sites": 3, "rounds": 2, "local_steps": 2, "batch_size": 8, "data_scale": 0.15}


def _trainable() -> Trainable:
    torch.manual_seed(0)
    return Trainable(build_model("tiny"), build_loss("auc_margin", 1, [0.3]))


# -- budgets and measured memory ------------------------------------------------------------
def test_budgets_parse_fractions_bytes_and_units_and_name_bad_values():
    assert parse_budget(0.15) == MemoryBudget(fraction=0.15)
    assert parse_budget(2_000_000) == MemoryBudget(bytes=2_000_000)
    assert parse_budget("64MiB") == MemoryBudget(bytes=64 * 2**20)
    assert parse_budget("1.5 GB") == MemoryBudget(bytes=1_500_000_000)
    assert parse_budget("0.4") == MemoryBudget(fraction=0.4)
    for bad in (0, -3, "lots", "5 parsecs", True):
        with pytest.raises(ValueError, match="site_memory\\[2\\]"):
            parse_budget(bad, "site_memory[2]")


def test_measured_memory_counts_the_trained_part_only():
    table = memory_table(TINY, batch_size=8, image_size=32)
    model = build_model("tiny")
    groups = [row.groups[0] for row in table]
    assert groups == ["stem", "denseblock1", "transition1", "denseblock2", "transition2",
                      "denseblock3", "norm", "classifier"]  # fmt: skip
    totals = [row.total for row in table]
    assert totals == sorted(totals, reverse=True) and totals[-1] < totals[0] / 50
    for row in table:  # weights: exactly the trained parameters and buffers, plus a, b, α
        trained = set(row.groups)
        tensors = [*model.parameters(), *model.buffers()]
        names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
        own = sum(
            t.numel() * t.element_size()
            for n, t in zip(names, tensors, strict=True)
            if group_of(n) in trained and t.is_floating_point()
        )
        assert row.weights == own + 3 * 4
        assert row.state == 3 * row.weights
    # the classifier alone saves its pooled input features (B × 32 floats) for the weight
    # gradient, plus the loss's few per-score tensors; the frozen network saves nothing
    pooled = 8 * 32 * 4
    assert pooled <= table[-1].activations < pooled + 8 * 4 * 8
    # the full step saves at least the first convolution's output (B × 16 × 16 × 16 floats)
    assert table[0].activations > 8 * 16 * 16 * 16 * 4


def test_activation_memory_grows_with_the_batch():
    steps = [measure_step(TINY, ["denseblock3", "norm", "classifier"], b, 32) for b in (4, 8, 16)]
    act = [step.activations for step in steps]
    # per-sample tensors grow linearly; BatchNorm's per-channel statistics are a constant
    assert act[2] - act[1] == 2 * (act[1] - act[0]) and act[0] > act[1] - act[0]
    assert steps[0].weights == steps[2].weights


def test_budget_maps_to_the_longest_suffix_that_fits():
    table = [
        StepMemory(("a", "b", "c"), 700, 100, 100, 100),  # full step: 1000
        StepMemory(("b", "c"), 300, 50, 50, 0),  # 400
        StepMemory(("c",), 100, 10, 10, 30),  # 150
    ]
    assert choose_groups(table, MemoryBudget(fraction=1.0)) is None
    assert choose_groups(table, MemoryBudget(bytes=5000)) is None
    assert choose_groups(table, MemoryBudget(fraction=0.4)) == ["b", "c"]
    assert choose_groups(table, MemoryBudget(fraction=0.399)) == ["c"]
    assert choose_groups(table, MemoryBudget(bytes=150)) == ["c"]
    with pytest.raises(ValueError, match="hospital_x: memory budget of 149 bytes"):
        choose_groups(table, MemoryBudget(bytes=149), "hospital_x")


# -- the weak site's local round ------------------------------------------------------------
@pytest.fixture(scope="module")
def site():
    return make_synthetic_federation(num_sites=1, image_size=28, seed=3, scale=0.2)[0]


@pytest.mark.parametrize("algorithm", ["codasca", "local_sgda", "fed_norm_sgda"])
def test_weak_site_keeps_its_frozen_prefix_bit_for_bit(tmp_path, site, algorithm):
    backend = build_backend(algorithm, local_steps=3, lr=0.5)
    training = LocalTraining(TINY, "auc_margin", batch_size=8, memory_budget=0.15)
    node = Node(site, backend, training, tmp_path)
    weak = node.trainable.trained_groups
    assert weak == ["transition2", "denseblock3", "norm", "classifier"]
    assert node.registration()["trained_groups"] == weak
    server = _trainable()
    state = backend.init_server(server, {site.name: len(site.train)})
    broadcast = backend.plan(state, 0)
    broadcast.config["pos_ratio"] = [0.3]
    reply = node.train(broadcast)

    after = node.trainable.everything()
    frozen = [n for n in after if n.startswith(("w/", "buf/"))]
    frozen = [n for n in frozen if group_of(n.split("/", 1)[1]) not in weak]
    assert any(n.startswith("buf/") and "running_mean" in n for n in frozen)
    for name in frozen:  # weights and BatchNorm statistics of the frozen input side
        assert torch.equal(after[name], broadcast.tensors[name]), name
    moved = [n for n in after if n.startswith("w/net.features.denseblock3")]
    assert any(not torch.equal(after[n], broadcast.tensors[n]) for n in moved)

    assert reply.trained_groups == weak
    expected = trained_part({n: t for n, t in state["model"].items()}, weak)
    sent = {n.split("/", 1)[1] if n.startswith(("dc/", "g/")) else n for n in reply.tensors}
    assert sent == {n for n in expected if n in sent} and sent <= set(expected)
    assert not any(group_of(n.split("/", 1)[1]) not in weak for n in sent if n[:2] in ("w/",))
    validate_reply(reply, state["model"], backend.reply_layout())
    reply.trained_groups = None  # the same tensors claimed as a full reply: missing ones
    with pytest.raises(InvalidReply, match="missing tensor"):
        validate_reply(reply, state["model"], backend.reply_layout())
    reply.trained_groups = ["stem", "classifier"]
    with pytest.raises(InvalidReply, match="not an output-side suffix"):
        validate_reply(reply, state["model"], backend.reply_layout())


# -- server side: each tensor averaged over the sites that trained it ------------------------
def test_per_tensor_average_is_exact_on_a_hand_built_example():
    a = {"w/x": torch.tensor([1.0, 2.0]), "w/y": torch.tensor([4.0])}
    b = {"w/y": torch.tensor([8.0])}
    c = {"w/x": torch.tensor([3.0, 6.0]), "w/y": torch.tensor([0.0])}
    out = weighted_mean([a, b, c], [0.25, 0.25, 0.5])
    assert torch.equal(out["w/y"], torch.tensor([0.25 * 4 + 0.25 * 8 + 0]))  # all: plain sum
    # x: only a and c trained it, weights 0.25 and 0.5 rescaled to 1/3 and 2/3
    assert torch.allclose(out["w/x"], torch.tensor([1 / 3 + 2.0, 2 / 3 + 4.0]), atol=1e-6)

    backend = LocalSGDA(site_weighting="examples")
    zeros = {"w/x": torch.zeros(2), "w/y": torch.zeros(1), "w/z": torch.ones(3)}
    sizes = (10, 30, 60)
    replies = [
        Reply(t, steps=1, num_examples=n, site=s)
        for s, t, n in zip("abc", (a, b, c), sizes, strict=True)
    ]
    new = backend.aggregate({"round": 0, "model": zeros}, replies)["model"]
    assert torch.equal(new["w/z"], torch.ones(3))  # nobody trained z: it keeps its value
    assert torch.allclose(new["w/x"], torch.tensor([(10 + 3 * 60) / 70, (20 + 6 * 60) / 70]))
    assert new["w/y"].item() == pytest.approx((4 * 10 + 8 * 30) / 100)


def test_codasca_control_variates_are_averaged_over_every_site_that_trains_the_tensor():
    """c of a tensor is the mean of c^k over the sites that train it, as registered: a
    registered weak site not heard from yet does not train the stem, so it is no divisor."""
    server = _trainable()
    backend = build_backend("codasca")
    state = backend.init_server(server, {"strong": 10, "weak": 10, "other": 10})
    groups = {"strong": None, "weak": ["norm", "classifier"], "other": ["classifier"]}
    state = backend.register_sites(state, {s: {"trained_groups": g} for s, g in groups.items()})
    model = state["model"]

    def reply(site, delta):
        tensors = dict(model) if groups[site] is None else trained_part(model, groups[site])
        variables = [n for n in tensors if not n.startswith("buf/")]
        tensors.update({CONTROL_DELTA + n: torch.full_like(model[n], delta) for n in variables})
        return Reply(tensors, steps=1, num_examples=10, site=site, trained_groups=groups[site])

    new = backend.aggregate(state, [reply("strong", 3.0), reply("weak", 6.0)])
    # every c^k started at 0: the heard sites' c^k are their Δc, "other"'s is still 0
    own = {"strong": 3.0, "weak": 6.0, "other": 0.0}
    for name in ("w/net.class_layers.out.weight", "w/net.features.norm5.weight",
                 "w/net.features.conv0.weight", "auc/a"):  # fmt: skip
        group = group_of(name[2:]) if name.startswith("w/") else None
        trainers = [s for s, g in groups.items() if g is None or group is None or group in g]
        expected = sum(own[s] for s in trainers) / len(trainers)
        torch.testing.assert_close(new["control"][name], torch.full_like(model[name], expected))
    # head: all three sites train it → 9/3; norm5: strong and weak → 9/2; stem: strong only
    head = new["control"]["w/net.class_layers.out.weight"]
    assert float(head.flatten()[0]) == pytest.approx(3.0)
    assert float(new["control"]["w/net.features.conv0.weight"].flatten()[0]) == pytest.approx(3.0)


# -- whole federations ----------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["codasca", "local_sgda"])
def test_all_strong_federation_reproduces_the_plain_backend_exactly(tmp_path, algorithm):
    plain = run_simulation(
        ExperimentConfig(algorithm=algorithm, runs_dir=str(tmp_path / "plain"), **SMALL)
    )
    strong = run_simulation(
        ExperimentConfig(
            algorithm=algorithm,
            runs_dir=str(tmp_path / "strong"),
            partial_training=True,
            site_memory=[1.0, "1GiB", 1.0],
            **SMALL,
        )
    )
    assert strong["global_auc"] == plain["global_auc"]
    a, b = load_torch(plain["model_path"]), load_torch(strong["model_path"])
    for name, tensor in a["state_dict"].items():
        assert torch.equal(tensor, b["state_dict"][name]), name


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_backend_runs_a_mixed_federation_and_records_trained_groups(tmp_path, algorithm):
    loss = "ce" if algorithm == "fedavg" else "auc_margin"
    config = ExperimentConfig(
        algorithm=algorithm,
        loss=loss,
        runs_dir=str(tmp_path),
        partial_training=True,
        **SMALL,
    )
    summary = run_simulation(config)
    with RunStore(tmp_path) as store:
        rows = store.site_rounds(summary["run_id"])
    trained = [json.loads(groups) for groups in rows[rows["round"] == 2]["trained_groups"]]
    assert sorted(len(groups) for groups in trained) == [4, 5, 8]  # weak, moderate, strong
    assert all(groups[-1] == "classifier" for groups in trained)
    assert summary["trained_groups"]["county_general"][0] == "denseblock2"  # the 40 % site
    assert set(rows[rows["round"] > 0]["status"]) == {"completed"}


def test_cli_partial_training_records_the_groups_per_site_and_round(tmp_path, capsys):
    config = tmp_path / "small.toml"
    config.write_text("data_scale = 0.15\n")
    args = ["simulate", "--config", str(config), "--partial-training", "--site-memory"]
    args += ["1.0,0.4,0.05", "--sites", "3", "--rounds", "2", "--local-steps", "2"]
    main([*args, "--batch-size", "8", "--runs-dir", str(tmp_path), "--json"])
    with RunStore(tmp_path) as store:
        run_id = store.runs()["id"].iloc[0]
        rows = store.site_rounds(run_id)
    rows = rows[rows["round"] > 0]
    assert len(rows) == 6
    depth = {
        s: len(json.loads(g)) for s, g in zip(rows["site"], rows["trained_groups"], strict=True)
    }
    assert sorted(depth.values()) == [2, 5, 8]  # 5 % of a full step: only norm + classifier
    with pytest.raises(SystemExit, match="site_memory needs partial_training"):
        main(["simulate", "--site-memory", "1,1,1", "--runs-dir", str(tmp_path)])
