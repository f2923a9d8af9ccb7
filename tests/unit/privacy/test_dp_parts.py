"""The parts DP-SGD stands on: Poisson batches, GroupNorm models, ε in the store and card."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest
import torch
from torch import nn

from fed_auc.data.base import Split
from fed_auc.data.poisson import PoissonBatches, class_rates
from fed_auc.models import ARCHITECTURES, build_model, group_count, model_from_config
from fed_auc.registry.card import render_model_card
from fed_auc.store.records import RoundRecord, SiteRound
from fed_auc.store.run_store import SCHEMA, RunStore


def split(rows: int, positives: int) -> Split:
    """Row i's image is the constant i / rows, so a batch says which rows it holds."""
    labels = torch.zeros(rows, 1)
    labels[:positives] = 1.0
    return Split((torch.arange(rows) / rows).reshape(rows, 1, 1, 1).expand(rows, 1, 4, 4), labels)


@pytest.mark.parametrize(
    ("positives", "negatives", "min_pos", "min_neg"),
    [(10, 990, 0.2, 0.0), (300, 700, 0.05, 0.0), (990, 10, 0.0, 0.25), (0, 50, 0.2, 0.0)],
)
def test_class_rates_keep_the_expected_batch_and_the_floors(positives, negatives, min_pos, min_neg):
    q_pos, q_neg = class_rates(positives, negatives, 32, min_pos, min_neg)
    assert 0 < q_pos <= 1 and 0 < q_neg <= 1
    expected = q_pos * positives + q_neg * negatives
    assert expected == pytest.approx(min(32, positives + negatives))
    if positives and negatives:
        assert q_pos * positives >= math.ceil(min_pos * 32) - 1e-9
        assert q_neg * negatives >= math.ceil(min_neg * 32) - 1e-9


def test_poisson_batches_include_each_row_at_its_class_rate_and_resume_exactly():
    data = split(200, 10)
    stream = PoissonBatches(data, 16, seed=3, min_pos_fraction=0.25)
    assert stream.positive_rate == pytest.approx(4 / 10)  # floor: 4 of 16 from 10 positives
    assert stream.sample_rate == stream.positive_rate  # the accountant takes the largest
    counts = torch.zeros(200)
    sizes = []
    for _ in range(2000):
        x, y, _ = next(stream)
        sizes.append(len(x))
        counts[(x[:, 0, 0, 0] * 200).round().long()] += 1
    freq = counts / 2000  # each row's inclusion frequency, against its class's rate (±4 sd)
    for rows, rate in (
        (slice(0, 10), stream.positive_rate),
        (slice(10, 200), stream.negative_rate),
    ):
        bound = 4 * math.sqrt(rate * (1 - rate) / 2000)
        assert (freq[rows] - rate).abs().max() < bound
    assert sum(sizes) / len(sizes) == pytest.approx(16, rel=0.03)
    assert len(set(sizes)) > 5  # Poisson: the batch size varies
    state = stream.state_dict()
    ahead = [next(stream)[0] for _ in range(3)]
    again = PoissonBatches(data, 16, seed=99, min_pos_fraction=0.25)
    again.load_state_dict(state)
    for want in ahead:
        assert torch.equal(next(again)[0], want)


def test_a_fixed_size_sampler_state_is_refused_by_name():
    stream = PoissonBatches(split(20, 5), 4)
    with pytest.raises(ValueError, match="fixed-size BatchStream"):
        stream.load_state_dict({"num_rows": 20, "queue": torch.arange(3)})


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_group_norm_models_have_no_batchnorm_and_rebuild_from_their_config(arch):
    groups = group_count(arch)
    assert 1 <= groups <= 32
    if arch == "tiny":
        model = build_model(arch, norm="group")
        norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
        assert norms and all(m.num_groups == groups for m in norms)
        assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
        assert model.config()["norm"] == "group"
        rebuilt = model_from_config(model.config())
        rebuilt.load_state_dict(model.state_dict())  # same names and shapes
        assert "norm" not in build_model(arch).config()  # BatchNorm configs stay as before


def test_an_old_store_gains_the_epsilon_columns_and_keeps_its_rows(tmp_path: Path):
    old_schema = SCHEMA.replace("    dp_epsilon REAL,", "").replace("    dp_delta REAL,", "")
    assert "dp_epsilon" not in old_schema
    path = tmp_path / "fed_auc.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(old_schema)
        conn.execute(
            "INSERT INTO runs (id, algorithm, status, config, started_at) "
            "VALUES ('old', 'codasca', 'completed', '{}', 0)"
        )
        conn.execute("INSERT INTO site_rounds (run_id, round, site, status) "
                     "VALUES ('old', 1, 'a', 'completed')")  # fmt: skip
    store = RunStore(tmp_path)
    assert store.site_rounds("old")["dp_epsilon"].isna().all()
    record = RoundRecord(
        round=1, sites=[SiteRound("a", "completed", dp_epsilon=2.5, dp_delta=1e-5)]
    )
    store.record_round("new", record)
    row = store.site_rounds("new").iloc[0]
    assert (row.dp_epsilon, row.dp_delta) == (2.5, 1e-5)
    store.close()


def test_the_model_card_lists_each_sites_epsilon():
    card = {
        "run_id": "r", "algorithm": "codasca", "loss": "auc_margin", "label_names": ["x"],
        "model_config": {"arch": "tiny"}, "rounds": 3, "sites": [], "seed": 0,
        "global_auc": 0.7, "initial_auc": 0.5, "worst_site_auc": 0.6, "hyperparameters": {},
        "data_description": "d", "intended_use": "u", "limitations": [],
        "privacy": {
            "mode": "example", "clip": 1.0, "noise_multiplier": None, "target_epsilon": 3.0,
            "delta": 1e-5, "accountant": "dp-accounting RDP", "protects": "one training example",
            "sites": {"north": {"epsilon_exported": 1.25, "epsilon_run": 2.9}},
        },
    }  # fmt: skip
    text = render_model_card(card)
    assert "## Privacy (example-level DP-SGD)" in text
    assert "| north | 1.250 | 2.900 |" in text and "target ε 3.0" in text
    assert "ε protects one training example" in text


def test_epsilon_does_not_log_the_accountants_skipped_orders(caplog):
    """dp-accounting logs a warning for each low RDP order it cannot evaluate (it bounds ε
    with the others); a DP run would print hundreds of them per round."""
    from fed_auc.privacy.accounting import Step, epsilon

    with caplog.at_level("WARNING"):
        spent = epsilon([Step(0.290909, 2.523879, 160)], 1e-5)
    assert math.isfinite(spent) and spent > 0
    assert "failed to converge" not in caplog.text
