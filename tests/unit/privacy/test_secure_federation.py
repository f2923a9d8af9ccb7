"""Secure aggregation in whole runs (`fed-auc simulate --secure-aggregation`): the same model
as plain aggregation, dropouts survived, too few sites fail cleanly, refusals by name."""

from __future__ import annotations

import base64
import json

import pytest
import torch

from fed_auc.cli import main
from fed_auc.coordinator.checkpoint import load_checkpoint
from fed_auc.coordinator.errors import FederationError
from fed_auc.data.synthetic import DEFAULT_PROFILES
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.node.node import Node
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore
from tests.support.apptest import open_page, texts

SMALL = {"sites": 3, "rounds": 2, "local_steps": 2, "batch_size": 8, "data_scale": 0.15}


def simulate(tmp_path, name, **changes):
    runs = tmp_path / name
    summary = run_simulation(ExperimentConfig(runs_dir=str(runs), **{**SMALL, **changes}))
    model = load_checkpoint(runs / summary["run_id"], changes.get("rounds", 2))["state"]["model"]
    with RunStore(runs) as store:
        rows = store.site_rounds(summary["run_id"])
        events = store.events(summary["run_id"])
    return model, rows, events


def first_round_state(tmp_path, name) -> dict:
    """What the coordinator aggregated in round 1: the model and, where the backend keeps
    them, its reference point and control variates (``simulate`` must have run)."""
    runs = tmp_path / name
    with RunStore(runs) as store:
        run_id = store.runs()["id"].iloc[-1]
    state = load_checkpoint(runs / run_id, 1)["state"]
    return {
        f"{part}:{name}": tensor
        for part in ("model", "ref", "control")
        if isinstance(state.get(part), dict)
        for name, tensor in state[part].items()
    }


def assert_same_model(secure, plain, atol=1e-6):
    """Float32 runs: the secure means differ from the plain float32 sums by their rounding
    (the quantization itself is ≤ K · 2^-33 per value)."""
    assert secure.keys() == plain.keys()
    for name in plain:
        assert torch.allclose(secure[name], plain[name], rtol=0, atol=atol), name


@pytest.mark.parametrize("algorithm", ["codasca", "fedavg", "coda_plus", "fed_norm_sgda"])
def test_a_secure_run_trains_the_plain_runs_model_and_records_no_per_site_signal(
    tmp_path, algorithm
):
    plain, plain_rows, _ = simulate(tmp_path, "plain", algorithm=algorithm)
    secure, rows, _ = simulate(tmp_path, "secure", algorithm=algorithm, secure_aggregation=True)
    # Round 1: what secure aggregation computed equals the plain sums within float32 rounding.
    first = first_round_state(tmp_path, "plain")
    assert len(first) > len(plain) or algorithm != "codasca"  # its control variates too
    assert_same_model(first_round_state(tmp_path, "secure"), first)
    # Round 2 trains from those states: float32 local training can magnify a 1e-7 difference
    # (CODASCA's correction divides moves by I·η; a ReLU or max-pool that switches sends a
    # gradient elsewhere), so the last model is held to a bound that such growth stays under.
    assert_same_model(secure, plain, atol=1e-3)
    trained = rows[rows["round"] > 0]
    assert (trained["status"] == "completed").all()
    assert trained[["update_norm", "drift", "cosine", "cv_drift"]].isna().all().all()
    assert plain_rows[plain_rows["round"] > 0]["drift"].notna().all()  # plain runs have them
    assert trained["auc"].tolist() == pytest.approx(
        plain_rows[plain_rows["round"] > 0]["auc"].tolist(), abs=1e-3
    )
    spent = json.loads(trained.iloc[0]["metrics"])["secure_aggregation_bytes"]["train"]
    assert spent["down"] > 0 and spent["up"] > 0  # keys and shares, beside the vector


def test_weak_sites_and_personal_heads_under_secure_aggregation(tmp_path):
    """Partial training (per-tensor trainer weights summed) and personal heads (never
    masked, never sent) give the plain run's model."""
    options = {"sites": 3, "rounds": 1, "partial_training": True, "personalize": "head"}
    plain, _, _ = simulate(tmp_path, "plain", **options)
    secure, rows, _ = simulate(tmp_path, "secure", secure_aggregation=True, **options)
    assert_same_model(secure, plain)
    groups = rows[rows["round"] == 1]["trained_groups"].map(json.loads).map(len)
    assert groups.nunique() > 1  # some site trained a suffix only


def _failing(monkeypatch, method, site, when):
    original = getattr(Node, method)

    def failing(self, *args):
        if self.name == site and when(*args):
            raise ConnectionError(f"{site} lost its network")
        return original(self, *args)

    monkeypatch.setattr(Node, method, failing)


def test_a_site_lost_after_sharing_keys_leaves_the_sum_of_the_others(tmp_path, monkeypatch):
    """It never sends its masked vector: the survivors' shares rebuild its mask key, the
    server removes its pairwise masks, and the model is the plain run's without it (one
    round: the models differ by float32 rounding only; later rounds' training amplifies it)."""
    lost = DEFAULT_PROFILES[1].name
    _failing(monkeypatch, "train", lost, lambda broadcast: True)
    plain, _, _ = simulate(tmp_path, "plain", sites=4, rounds=1)
    secure, rows, events = simulate(tmp_path, "secure", sites=4, rounds=1, secure_aggregation=True)
    assert_same_model(secure, plain)
    assert rows[(rows["round"] == 1) & (rows["site"] == lost)]["status"].item() == "error"
    assert events["message"].str.contains("lost its network").sum() == 1


def test_a_site_lost_before_unmasking_stays_in_the_sum(tmp_path, monkeypatch):
    """Its vector arrived, so its self mask is rebuilt from the others' shares."""
    lost = DEFAULT_PROFILES[2].name
    _failing(monkeypatch, "secure_step", lost, lambda step, message: step == "unmask")
    plain, _, _ = simulate(tmp_path, "plain", sites=4, rounds=1)
    secure, rows, events = simulate(tmp_path, "secure", sites=4, rounds=1, secure_aggregation=True)
    assert_same_model(secure, plain)
    assert (rows[rows["round"] == 1]["status"] == "completed").all()
    assert events["message"].str.contains("secure aggregation unmask").sum() == 1


def test_below_the_threshold_the_round_fails_and_nothing_recorded_is_lost(tmp_path, monkeypatch):
    lost = DEFAULT_PROFILES[0].name
    _failing(monkeypatch, "train", lost, lambda broadcast: broadcast.round == 1)
    with pytest.raises(FederationError, match="round 2.*fewer than the threshold 3"):
        simulate(tmp_path, "secure", secure_aggregation=True, secure_aggregation_threshold=3)
    with RunStore(tmp_path / "secure") as store:
        run = store.runs().iloc[0]
        assert run["status"] == "failed"
        assert store.rounds(run["id"])["round"].tolist() == [0, 1]  # kept as they were
        messages = store.events(run["id"])["message"]
        assert messages.str.contains("lost its network").sum() == 1
        assert messages.str.contains("fewer than the threshold").any()


SPARSE = {"sites": 5, "rounds": 1, "secure_aggregation_neighbours": 2}  # k = 2 < n − 1 = 4


def test_on_a_sparse_graph_a_site_lost_after_sharing_is_recovered_through_its_neighbours(
    tmp_path, monkeypatch
):
    lost = DEFAULT_PROFILES[1].name
    _failing(monkeypatch, "train", lost, lambda broadcast: True)
    plain, _, _ = simulate(tmp_path, "plain", sites=5, rounds=1)
    secure, rows, _ = simulate(tmp_path, "secure", secure_aggregation=True, **SPARSE)
    assert_same_model(secure, plain)
    assert rows[(rows["round"] == 1) & (rows["site"] == lost)]["status"].item() == "error"


def test_on_a_sparse_graph_too_few_neighbours_of_a_dropped_site_fail_the_round_cleanly(
    tmp_path, monkeypatch
):
    """The lost site's two neighbours (the sites told it dropped) fail to unmask: its mask key
    cannot be rebuilt from one share of the threshold 2, so the round fails, nothing recorded
    is lost."""
    lost = DEFAULT_PROFILES[1].name
    _failing(monkeypatch, "train", lost, lambda broadcast: broadcast.round == 1)
    original = Node.secure_step

    def neighbour_fails(self, step, message):
        # the survivors are the whole session's: its neighbours are those that masked with it
        told_dropped = step == "unmask" and lost not in message["survivors"]
        if told_dropped and lost in self._client()._session.masked_with:
            raise ConnectionError(f"{self.name} lost its network")
        return original(self, step, message)

    monkeypatch.setattr(Node, "secure_step", neighbour_fails)
    with pytest.raises(FederationError, match=f"round 2.*dropped site '{lost}'.*threshold 2"):
        simulate(tmp_path, "secure", secure_aggregation=True, **{**SPARSE, "rounds": 2})
    with RunStore(tmp_path / "secure") as store:
        run = store.runs().iloc[0]
        assert run["status"] == "failed"
        assert store.rounds(run["id"])["round"].tolist() == [0, 1]
        messages = store.events(run["id"])["message"]
        assert messages.str.contains("secure aggregation unmask").sum() == 2  # its neighbours


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        ({"aggregation": "centered_clip:1", "algorithm": "coda_plus"},
         "aggregation 'centered_clip:1' cannot be used with secure_aggregation: centered_clip "
         "clips each reply around the median"),
        ({"max_update_norm": 5.0}, "max_update_norm cannot be used with secure_aggregation: "
         "the server sees only the sum, never one reply's norm"),
        ({"participation": 0.3}, "at least 2 sampled sites"),
        ({"secure_aggregation_threshold": 4}, "threshold 4"),
        ({"secure_aggregation_threshold": 1}, "an integer ≥ 2, got 1"),
        ({"sites": 6, "secure_aggregation_neighbours": 3}, "even number ≥ 2 of neighbours"),
        ({"sites": 6, "secure_aggregation_neighbours": 2, "secure_aggregation_threshold": 4},
         "threshold 4 is larger than a site's neighbourhood: itself and 2 neighbours"),
    ],
)  # fmt: skip
def test_options_that_need_single_replies_are_refused_by_name(options, refusal):
    with pytest.raises(ValueError, match=refusal.replace("(", r"\(")):
        ExperimentConfig(**{**SMALL, "secure_aggregation": True, **options})
    for name in ("secure_aggregation_threshold", "secure_aggregation_neighbours"):
        with pytest.raises(ValueError, match=f"{name} needs secure_aggregation"):
            ExperimentConfig(**SMALL, **{name: 2})


def test_the_cli_flag_turns_it_on_and_the_dashboard_says_why_drift_is_missing(
    tmp_path, monkeypatch
):
    config = tmp_path / "small.toml"
    config.write_text("sites = 3\nrounds = 1\nlocal_steps = 1\ndata_scale = 0.15\nbatch_size = 8\n")
    main(["simulate", "--config", str(config), "--runs-dir", str(tmp_path), "--secure-aggregation"])
    with RunStore(tmp_path) as store:
        run = store.run(store.runs().iloc[0]["id"])
        assert run["config"]["secure_aggregation"] is True
    page = open_page(monkeypatch, tmp_path, "heterogeneity", run["id"])
    assert "unavailable for this run: under secure aggregation" in texts(page)


def _corrupting(monkeypatch, site, damage):
    """``site`` answers unmask with its first seed share damaged by ``damage``."""
    original = Node.secure_step

    def corrupted(self, step, message):
        answer = original(self, step, message)
        if step == "unmask" and self.name == site:
            owner = sorted(answer["b_shares"])[0]
            answer["b_shares"][owner] = damage(answer["b_shares"][owner])
        return answer

    monkeypatch.setattr(Node, "secure_step", corrupted)


def test_a_corrupted_unmasking_share_is_rejected_by_name_and_the_sum_stays_exact(
    tmp_path, monkeypatch
):
    """A flipped byte: the share fails its owner's commitment, so the sender's shares are
    left out (an event names it) and the others' rebuild the plain run's sum."""
    sender = DEFAULT_PROFILES[0].name

    def flip(text):
        raw = bytearray(base64.b64decode(text))
        raw[4] ^= 1
        return base64.b64encode(bytes(raw)).decode()

    _corrupting(monkeypatch, sender, flip)
    plain, _, _ = simulate(tmp_path, "plain", rounds=1)
    secure, rows, events = simulate(tmp_path, "secure", rounds=1, secure_aggregation=True)
    assert_same_model(secure, plain)
    assert (rows[rows["round"] == 1]["status"] == "completed").all()
    named = events["message"].str.contains(f"site '{sender}' sent a seed share of")
    assert named.sum() == 1


def test_a_malformed_unmasking_share_fails_the_round_cleanly(tmp_path, monkeypatch):
    """Below the threshold once it is rejected: a failed round naming the sender (no
    library traceback), the rounds already recorded kept."""
    sender = DEFAULT_PROFILES[0].name
    _corrupting(monkeypatch, sender, lambda text: base64.b64encode(b"abc").decode())
    with pytest.raises(FederationError, match=f"round 1.*rejected: .*site '{sender}' sent a "
                       "seed share of .* \\(3 bytes\\)"):  # fmt: skip
        simulate(tmp_path, "secure", secure_aggregation=True, secure_aggregation_threshold=3)
    with RunStore(tmp_path / "secure") as store:
        run = store.runs().iloc[0]
        assert run["status"] == "failed"
        assert store.rounds(run["id"])["round"].tolist() == [0]  # the warm-up, kept
        assert store.events(run["id"])["message"].str.contains(f"site '{sender}' sent").any()
