"""A whole simulated federation: node state, coordinator checks, store rows, export, CLI."""

from __future__ import annotations

import json

import pytest
import torch

from fed_auc.cli import main
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import load_state, load_torch
from fed_auc.models import model_from_config
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore

SMALL = {"sites": 3, "rounds": 2, "local_steps": 2, "batch_size": 8, "data_scale": 0.15}


def _simulate(tmp_path, **changes) -> dict:
    return run_simulation(ExperimentConfig(runs_dir=str(tmp_path), **{**SMALL, **changes}))


def test_codasca_run_records_every_round_and_site_and_exports_the_model(tmp_path):
    summary = _simulate(tmp_path)
    assert len(summary["global_auc"]) == 3  # round 0 (initial model) + 2 rounds
    assert all(0.0 <= auc <= 1.0 for auc in summary["global_auc"])
    with RunStore(tmp_path) as store:
        run = store.run(summary["run_id"])
        assert run["status"] == "completed" and run["algorithm"] == "codasca"
        rounds = store.rounds(summary["run_id"])
        assert rounds["round"].tolist() == [0, 1, 2]
        assert rounds["global_auc"].tolist() == pytest.approx(summary["global_auc"])
        assert (rounds["bytes_up"].iloc[1:] > rounds["bytes_down"].iloc[1:] / 3).all()
        sites = store.site_rounds(summary["run_id"])
        trained = sites[sites["round"] > 0]
        assert len(trained) == 6 and set(trained["status"]) == {"completed"}
        assert trained["steps"].tolist() == [2] * 6
        for column in ("update_norm", "drift", "cosine", "cv_drift", "auc", "bytes_up"):
            assert trained[column].notna().all(), column
        assert (trained["cosine"].abs() <= 1 + 1e-6).all()
        assert set(sites[sites["round"] == 0]["status"]) == {"initial"}
        assert len(store.sites(summary["run_id"])) == 3

    run_dir = tmp_path / summary["run_id"]
    checkpoint = load_state(run_dir / "checkpoint.pt")
    assert checkpoint["round"] == 2 and checkpoint["state"]["round"] == 2
    assert load_state(run_dir / "checkpoint.prev.pt")["round"] == 1
    assert checkpoint["accepted"] == {site: [1, 0] for site in summary["site_auc"]}
    for site in summary["site_auc"]:  # CODASCA's c_k persisted per node
        committed = load_state(run_dir / "nodes" / site / "local_state.pt")  # round 1's
        pending = load_state(run_dir / "nodes" / site / "local_state.pending.pt")  # round 2's
        assert set(committed) == {"tag", "backend", "sampler"} and committed["backend"]["control"]
        assert (committed["tag"], pending["tag"]) == ([0, 0], [1, 0])

    exported = load_torch(summary["model_path"])
    model = model_from_config(exported["model_config"])
    model.load_state_dict(exported["state_dict"])
    assert set(exported["auc"]) == {"a", "b", "alpha"}
    card = json.loads((run_dir / "model" / "model_card.json").read_text())
    assert card["global_auc"] == summary["global_auc"][card["selected_round"]]
    assert "Per-site test AUC" in (run_dir / "model" / "MODEL_CARD.md").read_text()


def test_same_seed_same_run(tmp_path):
    first = _simulate(tmp_path / "a", algorithm="coda_plus")
    second = _simulate(tmp_path / "b", algorithm="coda_plus")
    assert first["global_auc"] == second["global_auc"]
    a, b = load_torch(first["model_path"]), load_torch(second["model_path"])
    for name, tensor in a["state_dict"].items():
        assert torch.equal(tensor, b["state_dict"][name]), name


def test_a_failing_node_is_recorded_and_the_round_goes_on(tmp_path, monkeypatch):
    from fed_auc.data.synthetic import DEFAULT_PROFILES
    from fed_auc.node.node import Node

    broken = DEFAULT_PROFILES[1].name
    original = Node.train

    def flaky(self, broadcast):
        if self.name == broken:
            raise OSError("disk full")
        return original(self, broadcast)

    monkeypatch.setattr(Node, "train", flaky)
    summary = _simulate(tmp_path, algorithm="local_sgda")
    with RunStore(tmp_path) as store:
        rows = store.site_rounds(summary["run_id"])
        failed = rows[(rows["site"] == broken) & (rows["round"] > 0)]
        assert set(failed["status"]) == {"error"}
        assert failed["auc"].notna().all()  # it still scores the global model
        events = store.events(summary["run_id"])
        assert events["message"].str.contains("OSError: disk full").sum() == 2


def test_a_reply_with_nan_is_rejected_and_never_averaged(tmp_path, monkeypatch):
    from fed_auc.data.synthetic import DEFAULT_PROFILES
    from fed_auc.node.node import Node

    bad_site = DEFAULT_PROFILES[0].name
    original = Node.train

    def poisoned(self, broadcast):
        reply = original(self, broadcast)
        if self.name == bad_site:
            first = next(n for n in reply.tensors if n.startswith("w/"))
            reply.tensors[first] = torch.full_like(reply.tensors[first], float("nan"))
        return reply

    monkeypatch.setattr(Node, "train", poisoned)
    summary = _simulate(tmp_path)
    exported = load_torch(summary["model_path"])
    assert all(torch.isfinite(t).all() for t in exported["state_dict"].values())
    with RunStore(tmp_path) as store:
        rows = store.site_rounds(summary["run_id"])
        assert set(rows[(rows["site"] == bad_site) & (rows["round"] > 0)]["status"]) == {"rejected"}
        assert store.events(summary["run_id"])["message"].str.contains("NaN").any()


def test_a_round_without_any_valid_reply_fails_the_run_and_keeps_the_record(tmp_path, monkeypatch):
    from fed_auc.coordinator.errors import FederationError
    from fed_auc.node.node import Node

    def broken(self, broadcast):
        raise RuntimeError(f"GPU on fire at {self.name}")

    monkeypatch.setattr(Node, "train", broken)
    with pytest.raises(FederationError, match="round 1, phase 'train': no valid reply"):
        _simulate(tmp_path)
    with RunStore(tmp_path) as store:
        run = store.runs().iloc[0]
        assert run["status"] == "failed"
        assert store.rounds(run["id"])["round"].tolist() == [0]  # round 0 stays recorded
        messages = store.events(run["id"])["message"]
        assert messages.str.contains("GPU on fire").sum() == 3
        assert messages.str.contains("run failed: FederationError").any()


def test_partial_participation_selects_a_seeded_subset(tmp_path):
    summary = _simulate(tmp_path, participation=0.5, rounds=3)
    with RunStore(tmp_path) as store:
        rows = store.site_rounds(summary["run_id"])
    per_round = (
        rows[rows["round"] > 0].groupby("round")["status"].apply(lambda s: (s == "completed").sum())
    )
    assert per_round.tolist() == [2, 2, 2]  # ⌈0.5 · 3⌉
    assert set(rows[rows["round"] > 0]["status"]) == {"completed", "idle"}


def test_heterogeneous_local_steps_are_done_and_recorded(tmp_path):
    summary = _simulate(tmp_path, local_steps_range="1:5", rounds=3)
    with RunStore(tmp_path) as store:
        rows = store.site_rounds(summary["run_id"])
    steps = rows[rows["round"] > 0]["steps"].tolist()
    assert all(1 <= s <= 5 for s in steps) and len(set(steps)) > 1
    again = _simulate(tmp_path / "again", local_steps_range="1:5", rounds=3)
    with RunStore(tmp_path / "again") as store:
        rows_again = store.site_rounds(again["run_id"])
    assert rows_again[rows_again["round"] > 0]["steps"].tolist() == steps  # seeded

    fixed = _simulate(tmp_path / "fixed", site_local_steps=[2, 5, 3])
    with RunStore(tmp_path / "fixed") as store:
        rows = store.site_rounds(fixed["run_id"])
    from fed_auc.data.synthetic import DEFAULT_PROFILES

    first = rows[rows["round"] == 1].set_index("site")["steps"]
    assert [first[p.name] for p in DEFAULT_PROFILES[:3]] == [2, 5, 3]
    bytes_ = json.loads(rows[rows["round"] == 1]["metrics"].iloc[0])["bytes"]["train"]
    assert bytes_["down"] == rows[rows["round"] == 1]["bytes_down"].iloc[0]


@pytest.mark.parametrize("algorithm", ["codasca", "fedsgda_storm", "fed_norm_sgda"])
def test_byte_counters_equal_the_bytes_of_the_tensors_sent(tmp_path, monkeypatch, algorithm):
    from fed_auc.transport.local import LocalTransport

    sent: dict[tuple[int, str, str], tuple[int, int]] = {}
    original = LocalTransport.train

    def recording(self, requests):
        answers = original(self, requests)
        for site, broadcast in requests.items():
            down = sum(len(t.numpy().tobytes()) for t in broadcast.tensors.values())
            up = sum(len(t.numpy().tobytes()) for t in answers[site].tensors.values())
            sent[(broadcast.round + 1, site, broadcast.phase)] = (down, up)
        return answers

    monkeypatch.setattr(LocalTransport, "train", recording)
    summary = _simulate(tmp_path, algorithm=algorithm, participation=0.7)
    with RunStore(tmp_path) as store:
        rows = store.site_rounds(summary["run_id"])
        rounds = store.rounds(summary["run_id"]).set_index("round")
    recorded = {}
    for row in rows[rows["round"] > 0].itertuples():
        for phase, b in json.loads(row.metrics).get("bytes", {}).items():
            recorded[(row.round, row.site, phase)] = (b["down"], b["up"])
    assert recorded == sent and sent
    for round_ in (1, 2):
        down = sum(d for (r, _, _), (d, _) in sent.items() if r == round_)
        up = sum(u for (r, _, _), (_, u) in sent.items() if r == round_)
        assert (rounds.loc[round_, "bytes_down"], rounds.loc[round_, "bytes_up"]) == (down, up)


def test_local_steps_options_are_validated():
    with pytest.raises(ValueError, match="MIN:MAX"):
        ExperimentConfig(local_steps_range="3-20")
    with pytest.raises(ValueError, match="1 ≤ MIN ≤ MAX"):
        ExperimentConfig(local_steps_range="5:2")
    with pytest.raises(ValueError, match="one value per site"):
        ExperimentConfig(sites=3, site_local_steps=[2, 5])


def test_min_max_backends_refuse_cross_entropy():
    with pytest.raises(ValueError, match="codasca.*min-max AUC method"):
        ExperimentConfig(algorithm="codasca", loss="ce")
    with pytest.raises(ValueError, match="model must be one of"):
        ExperimentConfig(model="resnet")


@pytest.mark.slow
def test_cli_simulate_json_and_runs_listing(tmp_path, capsys):
    args = [
        "simulate",
        "--algorithm",
        "fedavg",
        "--sites",
        "2",
        "--rounds",
        "2",
        "--local-steps",
        "2",
        "--batch-size",
        "8",
        "--seed",
        "3",
        "--runs-dir",
        str(tmp_path),
        "--json",
    ]
    config = tmp_path / "small.toml"
    config.write_text("data_scale = 0.15\n")
    assert main([*args, "--config", str(config)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["algorithm"] == "fedavg" and len(summary["global_auc"]) == 3
    assert set(summary["site_auc"]) and summary["run_id"]

    assert main(["runs", "--runs-dir", str(tmp_path), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [(r["run_id"], r["status"], r["rounds"]) for r in runs] == [
        (summary["run_id"], "completed", 2)
    ]


def test_cli_rejects_unknown_config_keys(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("algorithm = 'codasca'\nlocal_step = 3\n")
    with pytest.raises(SystemExit, match=r"unknown key\(s\) \['local_step'\]"):
        main(["simulate", "--config", str(config), "--runs-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="algorithm must be one of"):
        main(["simulate", "--algorithm", "nope", "--runs-dir", str(tmp_path)])


def test_eval_every_evaluates_round_zero_every_nth_and_the_last(tmp_path):
    summary = _simulate(tmp_path / "sparse", rounds=5, eval_every=2)
    with RunStore(tmp_path / "sparse") as store:
        rounds = store.rounds(summary["run_id"]).set_index("round")
        assert rounds["global_auc"].notna().tolist() == [True, False, True, False, True, True]
        sites = store.site_rounds(summary["run_id"])
        assert sites[sites["round"] == 3]["auc"].isna().all()
        assert set(sites[sites["round"] == 3]["status"]) == {"completed"}
    every = _simulate(tmp_path / "every", rounds=5)
    assert every["global_auc"][-1] == summary["global_auc"][-1]  # evaluation changes nothing
    with pytest.raises(ValueError, match="eval_every"):
        ExperimentConfig(eval_every=0)


def test_shared_model_and_state_on_disk_give_the_same_run(tmp_path, monkeypatch):
    """Nodes sharing one warm model, or keeping their state on disk only, train exactly as
    nodes with their own model and state in memory."""
    import fed_auc.simulation as simulation
    from fed_auc.node.node import Node

    shared = _simulate(tmp_path / "shared", select="last")
    build = Node.__init__

    def own_model(self, *args, trainable=None, **kwargs):
        build(self, *args, **kwargs)

    monkeypatch.setattr(Node, "__init__", own_model)
    own = _simulate(tmp_path / "own", select="last")
    monkeypatch.setattr(simulation, "STATE_IN_MEMORY_UP_TO", 0)
    fed = simulation.build_federation(ExperimentConfig(runs_dir=str(tmp_path / "disk"), **SMALL))
    fed.coordinator.run(SMALL["rounds"])
    fed.coordinator.close()
    nodes = fed.coordinator.transport.nodes.values()
    assert all(node._local_state is None for node in nodes)  # nothing kept between rounds
    disk = fed.coordinator.backend.global_tensors(fed.coordinator.state)
    fed.store.close()

    assert shared["global_auc"] == own["global_auc"]
    a, b = load_torch(shared["model_path"]), load_torch(own["model_path"])
    for name, tensor in a["state_dict"].items():
        assert torch.equal(tensor, b["state_dict"][name]), name
        on_disk = disk.get("w/" + name, disk.get("buf/" + name, tensor))  # not: int counters
        assert torch.equal(tensor, on_disk), name
