"""--early-stop N: the rounds end once pooled validation AUC has not improved for N
evaluations, counting from the best model of the whole run (warm-up and --init included)."""

from __future__ import annotations

import pytest
import torch

from fed_auc.coordinator.selection import BestModel, Stage
from fed_auc.coordinator.stopping import EarlyStop
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.store.records import RoundRecord

WARM = Stage("warm-up", "warm", "fedavg", "ce")
MAIN = Stage("main", "run", "codasca", "auc")


def offer(best: BestModel, stage: Stage, round_: int, val: float | None) -> None:
    tensors = {"w/x": torch.full((2,), float(round_))}
    if stage is MAIN:  # only an AUC run's model has a, b, α
        tensors["auc/a"] = torch.tensor([float(round_)])
    best.offer(RoundRecord(round=round_, global_val_auc=val), tensors, stage)


def first_stop(best: BestModel, rule: EarlyStop, scores: list[float | None]) -> int | None:
    for round_, val in enumerate(scores, start=1):
        offer(best, MAIN, round_, val)
        if rule.reason(best) is not None:
            return round_
    return None


def test_stops_after_n_evaluations_without_a_gain(tmp_path) -> None:
    # best 0.70 at round 2; rounds 3, 5, 6 are evaluated without a gain (4 is not evaluated,
    # 6 only ties): the third such evaluation is round 6
    scores = [0.60, 0.70, 0.65, None, 0.69, 0.70, 0.80]
    best = BestModel(tmp_path, "best_val")
    assert first_stop(best, EarlyStop(3), scores) == 6
    reason = EarlyStop(3).reason(best)
    assert reason == ("pooled validation AUC has not improved for 3 evaluations on 0.7000 at "
                      "round 2 (--early-stop 3)")  # fmt: skip


def test_zero_never_stops(tmp_path) -> None:
    assert first_stop(BestModel(tmp_path, "best_val"), EarlyStop(0), [0.9, 0.1, 0.1, 0.1]) is None


def test_the_warmup_best_counts_and_its_rounds_do_not(tmp_path) -> None:
    """The warm-up rising to 0.9 is not counted against the run; an AUC phase that never
    reaches 0.9 stops after N of its own evaluations, and the export is the warm-up's."""
    best = BestModel(tmp_path, "best_val")
    for round_, val in enumerate([0.7, 0.9, 0.8], start=1):
        offer(best, WARM, round_, val)
    assert EarlyStop(1).reason(best) is None  # a warm-up round is not an evaluation of the run
    offer(best, MAIN, 0, 0.8)  # the warm-up's end again: not a candidate, not counted
    assert first_stop(best, EarlyStop(2), [0.85, 0.88, 0.95]) == 2
    assert "at warm-up round 2" in EarlyStop(2).reason(best)
    assert best.selected == [{"stage": "warm-up", "run_id": "warm", "algorithm": "fedavg",
                              "loss": "ce", "round": 2, "val_auc": 0.9}]  # fmt: skip


def test_a_resumed_run_counts_the_evaluations_before_the_crash(tmp_path) -> None:
    best = BestModel(tmp_path, "last")  # plain last keeps no tensors on disk, but the history
    first_stop(best, EarlyStop(3), [0.8, 0.7, 0.6])
    resumed = BestModel(tmp_path, "last")
    assert EarlyStop(3).reason(resumed) is None
    offer(resumed, MAIN, 3, 0.6)  # round 3 offered again after the resume: not counted twice
    assert EarlyStop(3).reason(resumed) is None
    offer(resumed, MAIN, 4, 0.75)
    assert EarlyStop(3).reason(resumed) is not None


def test_a_mean_over_warmup_and_auc_rounds_keeps_the_tensors_all_have(tmp_path) -> None:
    best = BestModel(tmp_path, "best_val:2")
    offer(best, WARM, 5, 0.9)
    offer(best, MAIN, 1, 0.8)
    offer(best, MAIN, 2, 0.7)
    assert [(s["stage"], s["round"]) for s in best.selected] == [("warm-up", 5), ("main", 1)]
    assert torch.equal(best.tensors["w/x"], torch.full((2,), 3.0))
    assert "auc/a" not in best.tensors  # the warm-up's model has no a, b, α to average


def test_default_is_on_for_image_files_only() -> None:
    assert ExperimentConfig().early_stop == 0
    assert ExperimentConfig(data="medmnist:x.npz").early_stop == 10
    assert ExperimentConfig(data="medmnist:x.npz", early_stop=0).early_stop == 0
    with pytest.raises(ValueError, match="early_stop must be"):
        ExperimentConfig(early_stop=-1)
