"""BatchStream: positive and negative floors, epoch coverage, determinism and exact resume."""

from __future__ import annotations

import io
import math

import pytest
import torch

from fed_auc.data.base import Split
from fed_auc.data.sampling import BatchStream
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.experiment.files import recorded_config
from fed_auc.simulation import build_federation
from tests.support.batches import make_split


def take(stream: BatchStream, batches: int) -> list[torch.Tensor]:
    return [stream.next_indices() for _ in range(batches)]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return torch.equal(torch.cat(a), torch.cat(b))


def is_positive(split: Split, rows: torch.Tensor) -> torch.Tensor:
    return (split.labels[rows] == 1).any(dim=1)


@pytest.mark.parametrize(
    ("batch_size", "fraction"), [(0, 0.2), (-3, 0.2), (2.5, 0.2), (True, 0.2), (8, -0.1), (8, 1.0)]
)
def test_rejects_bad_arguments(batch_size: object, fraction: float) -> None:
    with pytest.raises(ValueError, match="batch_size|min_pos_fraction"):
        BatchStream(make_split(20, 4), batch_size=batch_size, min_pos_fraction=fraction)


def test_rejects_a_bad_negative_floor_and_floors_that_overfill_the_batch() -> None:
    with pytest.raises(ValueError, match=r"min_neg_fraction = 1\.0: must be in \[0, 1\)"):
        BatchStream(make_split(20, 4), batch_size=8, min_neg_fraction=1.0)
    with pytest.raises(ValueError, match="ask for 9 floored rows in a batch of 8"):
        BatchStream(make_split(20, 4), batch_size=8, min_pos_fraction=0.6, min_neg_fraction=0.5)


def test_negative_floor_holds_in_every_batch_of_a_nearly_all_positive_site() -> None:
    split = make_split(125, 124)  # the BreastMNIST site under label skew: 1 negative
    stream = BatchStream(split, batch_size=32, seed=0, min_neg_fraction=0.1)
    assert (stream.min_positives, stream.min_negatives) == (2, 4)
    for rows in take(stream, 100):
        assert len(rows) == 32 and int((~is_positive(split, rows)).sum()) >= 4
    without = BatchStream(split, batch_size=32, seed=0)
    assert min(int((~is_positive(split, r)).sum()) for r in take(without, 100)) == 0


def test_both_floors_hold_together_and_every_row_is_still_covered() -> None:
    split = make_split(300, 150)
    stream = BatchStream(split, 32, seed=6, min_pos_fraction=0.4, min_neg_fraction=0.4)
    for rows in take(stream, 40):
        positives = int(is_positive(split, rows).sum())
        assert positives >= 13 and 32 - positives >= 13
    assert set(torch.cat(take(stream, 20)).tolist()) == set(range(300))


def test_a_zero_negative_floor_leaves_the_stream_as_it_was() -> None:
    split = make_split(200, 8)
    assert same(
        take(BatchStream(split, 32, seed=3, min_pos_fraction=0.2), 30),
        take(BatchStream(split, 32, seed=3, min_pos_fraction=0.2, min_neg_fraction=0.0), 30),
    )


def test_rejects_empty_split() -> None:
    empty = Split(torch.zeros(0, 1, 4, 4), torch.zeros(0, 1))
    with pytest.raises(ValueError, match="empty"):
        BatchStream(empty, batch_size=4)


def test_batches_gather_the_rows_they_report() -> None:
    split = make_split(50, 5)
    stream = BatchStream(split, batch_size=16, seed=3)
    twin = BatchStream(split, batch_size=16, seed=3)
    for _ in range(10):
        x, y, _ = next(stream)
        rows = twin.next_indices()
        assert x.shape == (16, 1, 4, 4) and y.shape == (16, 1)
        assert torch.equal(x[:, 0, 0, 0].long(), rows)
        assert torch.equal(y, split.labels[rows])


def test_positive_floor_holds_in_every_batch() -> None:
    split = make_split(400, 12)  # 3 % positives: 1 per batch of 32 on average
    stream = BatchStream(split, batch_size=32, seed=0, min_pos_fraction=0.2)
    assert stream.min_positives == math.ceil(0.2 * 32)
    for rows in take(stream, 300):
        assert len(rows) == 32
        assert int(is_positive(split, rows).sum()) >= stream.min_positives


def test_floor_counts_a_row_positive_when_any_label_is() -> None:
    split = make_split(200, 6, num_labels=3)  # positives only in the last label
    split.labels[:, 0] = float("nan")
    stream = BatchStream(split, batch_size=20, seed=1, min_pos_fraction=0.25)
    for rows in take(stream, 50):
        assert int(is_positive(split, rows).sum()) >= 5


def test_floor_still_covers_every_row() -> None:
    split = make_split(300, 9)
    stream = BatchStream(split, batch_size=32, seed=2, min_pos_fraction=0.3)
    seen = torch.cat(take(stream, 15))  # 15 * (32 - 10) = 330 rows from the epoch order
    assert set(seen.tolist()) == set(range(300))


def test_floor_tops_up_only_what_is_missing() -> None:
    """Batches consume the epoch order as far as the floor allows, then add positives."""
    split = make_split(600, 90)
    order = torch.cat(take(BatchStream(split, 32, seed=4, min_pos_fraction=0.0), 19))[:600]
    stream = BatchStream(split, 32, seed=4, min_pos_fraction=0.5)  # same first epoch
    position = 0
    for _ in range(20):
        rows = stream.next_indices()
        taken = 0
        while taken < 32 and rows[taken] == order[position + taken]:
            taken += 1
        extra = rows[taken:]
        assert bool(is_positive(split, extra).all())
        if len(extra):
            assert int(is_positive(split, rows).sum()) == stream.min_positives
            assert not bool(is_positive(split, order[position + taken : position + taken + 1]))
        position += taken
    assert position > 20 * (32 - stream.min_positives)


@pytest.mark.parametrize("n", [96, 100])
def test_without_floor_every_row_once_per_epoch(n: int) -> None:
    split = make_split(n, 10)
    stream = BatchStream(split, batch_size=32, seed=5, min_pos_fraction=0.0)
    rows = torch.cat(take(stream, n * 3 // 32 + 1))[: 3 * n]
    for epoch in rows.split(n):
        assert torch.equal(epoch.sort().values, torch.arange(n))
    assert stream.epoch >= 3


def test_single_class_split_applies_no_floor() -> None:
    split = make_split(64, 0)
    stream = BatchStream(split, batch_size=16, seed=0, min_pos_fraction=0.5)
    assert stream.min_positives == 0
    rows = torch.cat(take(stream, 4))
    assert torch.equal(rows.sort().values, torch.arange(64))


def test_split_smaller_than_batch_repeats_rows() -> None:
    split = make_split(10, 1)
    stream = BatchStream(split, batch_size=32, seed=0, min_pos_fraction=0.2)
    for rows in take(stream, 20):
        assert len(rows) == 32 and rows.min() >= 0 and rows.max() < 10
        assert int(is_positive(split, rows).sum()) >= 7
    no_floor = BatchStream(split, batch_size=32, seed=0, min_pos_fraction=0.0)
    assert set(no_floor.next_indices().tolist()) == set(range(10))


def test_same_seed_same_stream_other_seed_other_stream() -> None:
    split = make_split(200, 20)
    a, b, c = (BatchStream(split, 32, seed=s) for s in (7, 7, 8))
    first, second, third = take(a, 20), take(b, 20), take(c, 20)
    assert same(first, second)
    assert not same(first, third)


@pytest.mark.parametrize(
    ("n", "positives", "fraction", "neg_fraction"),
    [(200, 5, 0.2, 0.0), (200, 5, 0.0, 0.0), (10, 5, 0.2, 0.0), (200, 195, 0.05, 0.2)],
)
def test_resume_from_state_dict_reproduces_the_stream(
    n: int, positives: int, fraction: float, neg_fraction: float
) -> None:
    split = make_split(n, positives)
    floors = {"min_pos_fraction": fraction, "min_neg_fraction": neg_fraction}
    original = BatchStream(split, 32, seed=11, **floors)
    take(original, 7)
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)  # as a checkpoint would
    expected = take(original, 25)
    resumed = BatchStream(split, 32, seed=999, **floors)
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer))
    assert same(expected, take(resumed, 25))
    assert resumed.epoch == original.epoch


def test_a_state_saved_before_the_negative_floor_still_loads() -> None:
    split = make_split(200, 20)
    original = BatchStream(split, 32, seed=2)
    take(original, 3)
    state = original.state_dict()
    del state["negative_queue"]  # a checkpoint written by an earlier fed-auc
    resumed = BatchStream(split, 32, seed=0)
    resumed.load_state_dict(state)
    assert same(take(original, 10), take(resumed, 10))


def test_state_dict_is_a_snapshot() -> None:
    stream = BatchStream(make_split(100, 10), 32, seed=0)
    state = stream.state_dict()
    expected = take(stream, 5)
    take(stream, 3)  # moving on must not alter the saved state
    stream.load_state_dict(state)
    assert same(expected, take(stream, 5))


def test_load_state_dict_rejects_other_split() -> None:
    state = BatchStream(make_split(100, 10), 32).state_dict()
    with pytest.raises(ValueError, match="100 rows"):
        BatchStream(make_split(50, 5), 32).load_state_dict(state)


def test_negative_floor_defaults_for_image_files_only_and_is_checked_early() -> None:
    assert ExperimentConfig().min_neg_fraction == 0.0
    assert ExperimentConfig(data="medmnist:x.npz").min_neg_fraction == 0.25
    assert ExperimentConfig(data="medmnist:x.npz", min_neg_fraction=0.0).min_neg_fraction == 0.0
    with pytest.raises(ValueError, match=r"min_neg_fraction must be in \[0, 1\), got 1.5"):
        ExperimentConfig(min_neg_fraction=1.5)
    with pytest.raises(ValueError, match="floor 34 rows of a batch of 32"):
        ExperimentConfig(min_pos_fraction=0.55, min_neg_fraction=0.5)


def test_a_node_samples_with_the_runs_negative_floor(tmp_path) -> None:
    config = ExperimentConfig(sites=2, min_neg_fraction=0.25, runs_dir=str(tmp_path))
    federation = build_federation(config)
    try:
        nodes = federation.coordinator.transport.nodes.values()
        assert [node.batches.min_negatives for node in nodes] == [8, 8]
    finally:
        federation.coordinator.close()


def test_a_run_recorded_before_the_negative_floor_resumes_without_one(tmp_path) -> None:
    recorded = ExperimentConfig(data="medmnist:x.npz").to_dict()
    assert recorded_config(recorded, tmp_path).min_neg_fraction == 0.25
    del recorded["min_neg_fraction"]  # a run recorded by an earlier fed-auc
    assert recorded_config(recorded, tmp_path).min_neg_fraction == 0.0
