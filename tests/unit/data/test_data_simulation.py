"""`simulate --data medmnist:...`: partition manifest, warm-up, best-validation export, cards."""

from __future__ import annotations

import json

import pytest

from fed_auc.data.partition import MANIFEST_FORMAT
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import load_torch
from fed_auc.metrics.wording import selected_text
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore
from tests.support.data_files import write_npz


def test_medmnist_federation_with_warmup_exports_the_best_validation_round(tmp_path):
    npz = write_npz(tmp_path / "m.npz", n=(120, 40, 40))
    config = ExperimentConfig(
        data=f"medmnist:{npz}",
        partition="dirichlet:1.0",
        sites=3,
        rounds=4,
        local_steps=2,
        batch_size=8,
        image_size=16,
        warmup_rounds=2,
        select="best_val",
        runs_dir=str(tmp_path / "runs"),
    )
    summary = run_simulation(config)
    run_dir = tmp_path / "runs" / summary["run_id"]
    manifest = json.loads((run_dir / "partition.json").read_text())
    assert manifest["format"] == MANIFEST_FORMAT and manifest["partition"] == "dirichlet:1.0"
    assert sum(len(s["test"]) for s in manifest["sites"].values()) == 40
    with RunStore(tmp_path / "runs") as store:
        runs = store.runs()
        assert sorted(runs["algorithm"]) == ["codasca", "fedavg"]  # main run + its warm-up
        warm_id = runs.loc[runs["algorithm"] == "fedavg", "id"].iloc[0]
        rows = {"warm-up": store.rounds(warm_id), "main": store.rounds(summary["run_id"])}
        sites = store.sites(summary["run_id"])
    # the candidates: the warm-up's rounds, then the run's (round 0, the warm-up's end, is
    # not one again); the best validation AUC wins, ties the earlier
    candidates = [(stage, int(r.round), r.global_val_auc, r.global_auc)
                  for stage in ("warm-up", "main") for r in rows[stage].itertuples()
                  if r.round > 0]  # fmt: skip
    stage, round_, _, test_auc = max(candidates, key=lambda c: c[2])
    card = json.loads((run_dir / "model" / "model_card.json").read_text())
    assert [(s["stage"], s["round"]) for s in card["selected"]] == [(stage, round_)]
    assert card["selected_round"] == summary["selected_round"] == round_
    assert card["global_auc"] == pytest.approx(test_auc)
    assert card["warmup_rounds"] == 2 and 0 <= card["threshold"][0] <= 1
    assert [c["site"] for c in card["data_cards"]] == ["site0", "site1", "site2"]
    assert len(sites) == 3 and "data_cards" not in card["hyperparameters"]
    exported = load_torch(summary["model_path"])
    assert exported["model_config"]["num_labels"] == 1
    md = (run_dir / "model" / "MODEL_CARD.md").read_text()
    assert f"Exported model: {selected_text(card['selected'])}" in md


def test_warmup_moves_the_starting_model(tmp_path):
    npz = write_npz(tmp_path / "m.npz", signal=15)  # hard: AUC well below 1 at the start
    common = dict(data=f"medmnist:{npz}", sites=2, rounds=1, local_steps=1, batch_size=8)
    common.update(image_size=16, select="last")
    cold = run_simulation(ExperimentConfig(runs_dir=str(tmp_path / "a"), **common))
    warm = run_simulation(ExperimentConfig(runs_dir=str(tmp_path / "b"), warmup_rounds=1, **common))
    assert cold["global_auc"][0] != warm["global_auc"][0]  # round 0 = the warmed-up model


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"data": "dicom:x"}, "unknown source 'dicom'"),
        ({"partition": "dirichlet:0"}, "ALPHA must be > 0"),
        ({"select": "best_test"}, "select must be one of"),
        ({"warmup_rounds": -1}, "warmup_rounds"),
        ({"uncertain": "maybe"}, "uncertain must be one of"),
    ],
)
def test_bad_data_options_are_named(changes, message):
    with pytest.raises(ValueError, match=message):
        ExperimentConfig(**changes)
