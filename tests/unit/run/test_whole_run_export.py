"""The export chooses among every model a run made. An AUC phase that only lowers validation
AUC exports its warm-up's model and says so; ``--early-stop`` ends it at the round its rule
names; a run started with ``--init`` counts its round 0 as a candidate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fed_auc.data.base import Split
from fed_auc.data.medmnist import load_medmnist
from fed_auc.evaluate.local import evaluate_model
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.models import group_of
from fed_auc.registry.load import load_registered_model
from fed_auc.run import start
from fed_auc.run.headline import summary_headline
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore
from fed_auc.trainable import WEIGHT
from tests.support.data_files import write_npz


@pytest.fixture
def reverse_auc_phase(monkeypatch):
    """The main run's trained global models score every image with the opposite sign, so each
    of its rounds has validation AUC 1 − AUC: a deterministic AUC phase that undoes the good
    model it started from."""
    build = start.build_backend

    def build_reversed(name, **hyperparameters):
        backend = build(name, **hyperparameters)

        class Reversed(type(backend)):
            def global_tensors(self, state):
                tensors = dict(super().global_tensors(state))
                if state["round"] == 0:  # the model the phase starts from stays as it is
                    return tensors
                for key, value in tensors.items():
                    if key.startswith(WEIGHT) and group_of(key[len(WEIGHT) :]) == "classifier":
                        tensors[key] = -value
                return tensors

        backend.__class__ = Reversed
        return backend

    return lambda: monkeypatch.setattr(start, "build_backend", build_reversed)


@pytest.fixture(scope="module")
def npz(tmp_path_factory) -> Path:
    return write_npz(tmp_path_factory.mktemp("whole_run") / "m.npz", n=(80, 40, 40))


def config(npz: Path, runs: Path, **options) -> ExperimentConfig:
    base = dict(data=f"medmnist:{npz}", sites=2, local_steps=2, batch_size=8, image_size=16,
                model="tiny", lr=0.1, algorithm="codasca", select="best_val", augment="none",
                runs_dir=str(runs))  # fmt: skip
    return ExperimentConfig(**{**base, **options})


def warmup_run(store: RunStore, run_id: str) -> str:
    runs = store.runs()
    configs = [json.loads(c) if isinstance(c, str) else c for c in runs["config"]]
    return next(r for r, c in zip(runs["id"], configs, strict=True)
                if c.get("warmup_for") == run_id)  # fmt: skip


def pooled_test_auc(npz: Path, model_path: str) -> float:
    model, card = load_registered_model(model_path)
    pool = load_medmnist(npz)
    test = pool.split == "test"
    sites = {"all": Split(pool.images[test], pool.labels[test])}
    return evaluate_model(model, card, sites, n_boot=0)["sites"]["all"]["label"]["auc"]


def test_an_auc_phase_that_lowers_validation_auc_exports_the_warmup_model(
    npz, tmp_path, reverse_auc_phase
) -> None:
    reverse_auc_phase()
    summary = run_simulation(config(npz, tmp_path, warmup_rounds=3, rounds=3, early_stop=0))
    with RunStore(tmp_path) as store:
        warm = warmup_run(store, summary["run_id"])
        warm_rows = store.rounds(warm).set_index("round")
        main_rows = store.rounds(summary["run_id"]).set_index("round")
        events = " ".join(store.events(summary["run_id"])["message"])
    warm_val = warm_rows.loc[[1, 2, 3], "global_val_auc"]
    assert warm_val.max() > main_rows.loc[[1, 2, 3], "global_val_auc"].max()
    chosen = int(warm_val.idxmax())  # ties: the earlier round
    assert [(s["stage"], s["run_id"], s["round"]) for s in summary["selected"]] == [
        ("warm-up", warm, chosen)
    ]
    assert summary["selected"][0]["algorithm"] == "fedavg"
    assert summary["selected"][0]["loss"] == "ce"
    card = json.loads((Path(summary["model_path"]).parent / "model_card.json").read_text())
    assert card["selected"] == summary["selected"]
    # the card's numbers are the warm-up round's, and the file is that model
    assert card["global_val_auc"] == pytest.approx(warm_rows.loc[chosen, "global_val_auc"])
    assert card["global_auc"] == pytest.approx(warm_rows.loc[chosen, "global_auc"])
    assert pooled_test_auc(npz, summary["model_path"]) == pytest.approx(card["global_auc"])
    text = (Path(summary["model_path"]).parent / "MODEL_CARD.md").read_text()
    assert f"Exported model: warm-up round {chosen} (fedavg + ce)" in text
    assert f"exported the model of warm-up round {chosen} (fedavg + ce)" in events
    assert summary["stopped"] is None and len(main_rows) == 4  # rounds 0-3: no early stop


def test_early_stop_ends_the_run_at_the_round_its_rule_names(
    npz, tmp_path, reverse_auc_phase
) -> None:
    """Every main round is worse than the warm-up's best: with --early-stop 2 the run stops
    after its 2nd evaluated round, not its 8th."""
    reverse_auc_phase()
    summary = run_simulation(config(npz, tmp_path, warmup_rounds=3, rounds=8, early_stop=2))
    with RunStore(tmp_path) as store:
        rounds = store.rounds(summary["run_id"])
        events = list(store.events(summary["run_id"])["message"])
        status = store.run(summary["run_id"])["status"]
    assert int(rounds["round"].max()) == 2 and status == "completed"
    stopped = summary["stopped"]
    assert stopped["round"] == 2
    assert "has not improved for 2 evaluations" in stopped["reason"]
    assert "at warm-up round" in stopped["reason"]
    assert any(e.startswith("stopped after round 2: ") for e in events)
    card = json.loads((Path(summary["model_path"]).parent / "model_card.json").read_text())
    assert card["stopped"] == stopped and card["selected"][0]["stage"] == "warm-up"
    text = (Path(summary["model_path"]).parent / "MODEL_CARD.md").read_text()
    assert "Stopped early after round 2 of 8" in text
    assert f"stopped early after round 2: {stopped['reason']}" in summary_headline(summary)
    runs = subprocess.run([sys.executable, "-m", "fed_auc.cli", "runs", "--runs-dir",
                           str(tmp_path)], capture_output=True, text=True, check=True).stdout
    assert f"stopped early after round 2: {stopped['reason']}" in runs  # fed-auc runs too


def test_an_init_start_counts_its_round_zero(npz, tmp_path, reverse_auc_phase) -> None:
    """A run continued from a registered model whose own rounds are worse exports round 0,
    the --init model, and names it so."""
    first = run_simulation(config(npz, tmp_path / "first", loss="ce", algorithm="fedavg",
                                  rounds=3, warmup_rounds=0, early_stop=0))  # fmt: skip
    init = str(Path(first["model_path"]).parent)
    reverse_auc_phase()
    summary = run_simulation(
        config(npz, tmp_path / "second", init=init, rounds=2, warmup_rounds=0, early_stop=0)
        .resolve_files()
    )
    assert [(s["stage"], s["round"]) for s in summary["selected"]] == [("initial", 0)]
    exported, _ = load_registered_model(summary["model_path"])
    registered, _ = load_registered_model(first["model_path"])
    for key, value in registered.state_dict().items():
        assert torch.equal(exported.state_dict()[key], value), key
    text = (Path(summary["model_path"]).parent / "MODEL_CARD.md").read_text()
    assert "Exported model: round 0 (the --init model)" in text
