"""benchmarks/anchors/libauc_compare.py at toy size: its numbers add up, and the losses agree."""

from __future__ import annotations

import itertools

import pytest
import torch

from benchmarks.anchors import libauc_compare as bench
from fed_auc.losses import AUCMarginLoss

TOY = bench.Settings(
    model="tiny", image_size=28, batch_size=16, chunks=3, chunk_steps=2,
    n_train=60, n_test=40, threads=1,
)  # fmt: skip


def test_rates_and_ratios_follow_from_the_timings() -> None:
    ticks = itertools.count()
    clock = lambda: 0.25 * next(ticks)  # noqa: E731 - every timed chunk lasts 0.25 s
    rows = bench.compare(TOY, libauc=False, clock=clock)
    assert [r["name"] for r in rows] == [bench.BASELINE, "fed-auc local_sgda", "fed-auc codasca"]
    for row in rows:
        assert row["img_s"] == pytest.approx(TOY.chunk_steps * TOY.batch_size / 0.25)
        assert row["cost"] == pytest.approx(1.0)
        assert 0.0 <= row["test_auc"] <= 1.0


def test_real_timings_are_consistent_and_training_moves_the_models() -> None:
    rows = bench.compare(TOY, libauc=False)
    for row in rows:
        assert 0 < row["img_s_min"] <= row["img_s"] <= row["img_s_max"]
        assert row["cost_min"] <= row["cost"] <= row["cost_max"]
    assert rows[0]["cost_min"] == rows[0]["cost_max"] == 1.0
    # the contenders train differently, so their test AUCs are not all the same number
    assert len({round(r["test_auc"], 6) for r in rows}) > 1
    text = bench.markdown(rows, TOY, "python -m benchmarks.anchors.libauc_compare", (1.0, 2.0))
    assert "| fed-auc codasca |" in text and "Load average (1 min) 1.00 before" in text


@pytest.mark.skipif(not (bench.LIBAUC_DIR / "libauc").is_dir(), reason="LibAUC not installed")
def test_fed_auc_margin_loss_equals_libauc_aucm_loss() -> None:
    aucm_cls, _ = bench.import_libauc()
    torch.manual_seed(0)
    scores = torch.rand(32, 1, requires_grad=True)
    labels = (torch.rand(32, 1) < 0.3).float()
    ours = AUCMarginLoss(1, pos_ratio=0.3, margin=0.7)
    theirs = aucm_cls(margin=0.7, imratio=0.3, device=torch.device("cpu"))
    for loss in (ours, theirs):
        with torch.no_grad():
            loss.a.fill_(0.6), loss.b.fill_(0.2), loss.alpha.fill_(0.4)
    logit = torch.logit(scores)
    value = ours(logit, labels)
    (grad_ours,) = torch.autograd.grad(value, scores)
    reference = theirs(scores, labels, auto=False)
    (grad_theirs,) = torch.autograd.grad(reference, scores)
    assert value.item() == pytest.approx(reference.item(), rel=1e-5)
    torch.testing.assert_close(grad_ours, grad_theirs)


@pytest.mark.skipif(not (bench.LIBAUC_DIR / "libauc").is_dir(), reason="LibAUC not installed")
def test_update_costs_are_timed_per_contender_and_tabulated() -> None:
    updates = bench.update_ms(TOY, repeats=3)
    assert len(updates) == 5 and all(len(ms) == 2 and min(ms) > 0 for ms in updates.values())
    rows = bench.compare(bench.Settings(**{**vars(TOY), "chunks": 1}), libauc=False)
    text = bench.markdown(rows, TOY, "cmd", (1.0, 1.0), updates)
    for name, ms in updates.items():
        low, high = sorted(ms)
        assert f"| {name} | {(low + high) / 2:.1f} ({low:.1f}–{high:.1f}) |" in text
