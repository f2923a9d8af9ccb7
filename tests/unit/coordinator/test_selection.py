"""--select: the exported model is one round's or the mean of the best / last K rounds'."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fed_auc.coordinator.selection import (
    BEST_MODEL_FILE,
    BestModel,
    Stage,
    average,
    parse_select,
)
from fed_auc.data.base import Split
from fed_auc.data.medmnist import load_medmnist
from fed_auc.evaluate.local import evaluate_model
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import save_state
from fed_auc.registry.load import load_registered_model
from fed_auc.simulation import run_simulation
from fed_auc.store.records import RoundRecord
from fed_auc.store.run_store import RunStore
from tests.support.data_files import write_npz

MAIN = Stage("main", "run", "codasca", "auc")


def offer(best: BestModel, round_: int, val: float | None) -> None:
    """Round ``round_``'s model: every weight equals the round number."""
    tensors = {"w/x": torch.full((2,), float(round_)), "buf/n": torch.tensor([round_])}
    best.offer(RoundRecord(round=round_, global_val_auc=val), tensors, MAIN)


def test_parse_select_and_bad_values_named() -> None:
    assert parse_select("best_val") == ("best_val", 1)
    assert parse_select("last:5") == ("last", 5)
    for bad in ("best", "last:0", "best_val:x", "last:"):
        with pytest.raises(ValueError, match=f"select must be .* got '{bad}'"):
            parse_select(bad)
    with pytest.raises(ValueError, match="select must be"):
        ExperimentConfig(select="best_val:-1")


def test_default_averages_for_image_files_only() -> None:
    assert ExperimentConfig().select == "best_val"
    assert ExperimentConfig(data="medmnist:x.npz").select == "best_val:5"
    assert ExperimentConfig(data="medmnist:x.npz", select="last").select == "last"


def test_average_means_floats_and_keeps_the_last_integers() -> None:
    out = average([{"a": torch.tensor([1.0, 3.0]), "n": torch.tensor(1)},
                   {"a": torch.tensor([2.0, 5.0]), "n": torch.tensor(2)}])  # fmt: skip
    assert torch.equal(out["a"], torch.tensor([1.5, 4.0])) and int(out["n"]) == 2


def test_best_val_k_averages_the_k_best_validated_rounds(tmp_path) -> None:
    best = BestModel(tmp_path, "best_val:2")
    offer(best, 0, 0.5)
    assert best.rounds == [0]
    for round_, val in [(1, 0.7), (2, 0.9), (3, None), (4, 0.8), (5, 0.9)]:
        offer(best, round_, val)
    assert best.rounds == [2, 5]  # 0.9 twice; round 4's 0.8 is third
    assert best.averaged and best.round == 5
    assert torch.equal(best.tensors["w/x"], torch.full((2,), 3.5))
    assert int(best.tensors["buf/n"]) == 5
    reloaded = BestModel(tmp_path, "best_val:2")  # what a resumed run starts from
    assert reloaded.rounds == [2, 5] and torch.equal(reloaded.tensors["w/x"], best.tensors["w/x"])


def test_a_best_model_file_of_the_single_round_format_is_resumed(tmp_path) -> None:
    """Runs interrupted before averaged exports existed saved one round, not a list."""
    tensors = {"w/x": torch.full((2,), 3.0), "buf/n": torch.tensor(3)}
    save_state({"round": 3, "score": 0.8, "tensors": tensors}, tmp_path / BEST_MODEL_FILE)
    best = BestModel(tmp_path, "best_val")
    assert best.rounds == [3] and torch.equal(best.tensors["w/x"], tensors["w/x"])
    offer(best, 4, 0.7)  # worse: round 3 stays
    offer(best, 5, 0.85)
    assert best.rounds == [5]


def test_best_val_ties_keep_the_earlier_round_and_unscored_rounds_stand_in(tmp_path) -> None:
    best = BestModel(tmp_path, "best_val")
    offer(best, 1, None)
    assert best.rounds == [1]  # nothing validated yet: the latest round
    offer(best, 2, 0.8)
    offer(best, 3, 0.8)
    offer(best, 4, None)
    assert best.rounds == [2] and not best.averaged
    assert torch.equal(best.tensors["w/x"], torch.full((2,), 2.0))


def test_last_k_averages_the_last_rounds_and_round_zero_goes(tmp_path) -> None:
    best = BestModel(tmp_path, "last:3")
    for round_ in range(6):
        offer(best, round_, 1.0 - round_ / 10)  # validation falls: ignored by last
    assert best.rounds == [3, 4, 5]
    assert torch.equal(best.tensors["w/x"], torch.full((2,), 4.0))
    plain = BestModel(tmp_path / "plain", "last")
    offer(plain, 0, None)
    offer(plain, 1, None)
    assert plain.rounds == [1] and not plain.path.exists()  # plain last keeps nothing on disk


@pytest.fixture(scope="module")
def averaged_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("select")
    npz = write_npz(tmp / "m.npz", n=(60, 40, 40), signal=40)
    config = ExperimentConfig(
        data=f"medmnist:{npz}", sites=2, rounds=3, local_steps=2, batch_size=8, image_size=16,
        select="last:2", runs_dir=str(tmp / "runs"),
    )  # fmt: skip
    return npz, run_simulation(config)


def test_averaged_export_is_scored_as_itself(averaged_run) -> None:
    npz, summary = averaged_run
    model, card = load_registered_model(summary["model_path"])
    assert summary["averaged_rounds"] == card["averaged_rounds"] == [2, 3]
    assert card["selected_round"] == 3 and card["selection"] == "last:2"
    # the card's pooled test AUC is the averaged model's, as `fed-auc evaluate` computes it
    pool = load_medmnist(npz)
    test = pool.split == "test"
    sites = {"all": Split(pool.images[test], pool.labels[test])}
    pooled = evaluate_model(model, card, sites, n_boot=0)["sites"]["all"]["label"]["auc"]
    assert card["global_auc"] == pytest.approx(pooled) == summary["exported_auc"]
    kept = BestModel(Path(summary["run_dir"]), "last:2")  # the two rounds, from the run's disk
    state = model.state_dict()
    for name, value in kept.tensors.items():
        if name.startswith("w/"):
            torch.testing.assert_close(state[name[2:]], value)
    first, second = (entry["tensors"]["w/net.class_layers.out.weight"] for entry in kept.kept)
    assert not torch.equal(first, second)
    assert all(s["auc"] is not None and s["n_test"] > 0 for s in card["sites"])
    text = (Path(summary["model_path"]).parent / "MODEL_CARD.md").read_text()
    assert "mean of the weights of rounds [2, 3]" in text
    with RunStore(Path(summary["run_dir"]).parent) as store:
        events = list(store.events(summary["run_id"])["message"])
    assert "exported the mean of rounds [2, 3]" in events
