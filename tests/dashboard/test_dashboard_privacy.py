"""The Sites page's differential-privacy section, read from a store the test fills: each site's
ε (latest, per round, at the exported round), δ, σ, the budget-spent mark; one line for a run
without DP; update-level DP's site-level ε; clipping without noise, which has no ε."""

from __future__ import annotations

import pandas as pd
import pytest

from fed_auc.store.records import RoundRecord, SiteRound
from fed_auc.store.run_store import RunStore
from tests.support.apptest import open_page, texts

SITES = ("east", "north", "west")
# ε spent so far, as each site's accountant reported it: north's release in round 3 would
# have passed the target, so it refused (budget_spent) and keeps round 2's ε
EPSILON = {
    "east": [0.71, 1.12, 1.43],
    "north": [0.93, 1.61, 1.61],
    "west": [0.52, 0.84, 1.09],
}
SIGMA = {"east": 1.31, "north": 1.07, "west": 1.52}
DELTA = 1e-5
TARGET = 2.0
EXPORTED = 2


REPLACE_ONE = "replace one hospital's whole training data"


def _row(site: str, round_: int, dp: bool, relation: str | None = None) -> SiteRound:
    status = "initial" if round_ == 0 else "completed"
    if dp and site == "north" and round_ == 3:
        status = "budget_spent"
    row = SiteRound(
        site, status, n=100, positives=[30], n_test=60, test_positives=[20],
        auc=0.6 + 0.01 * round_, auc_lo=0.5, auc_hi=0.7, metrics={"undefined": []},
    )  # fmt: skip
    if dp and round_ > 0:
        row.dp_epsilon, row.dp_delta = EPSILON[site][round_ - 1], DELTA
        row.dp_relation = relation
        if status == "completed":
            row.metrics["dp_noise_multiplier"] = SIGMA[site]
    return row


def _run(
    store: RunStore, run_id: str, config: dict, dp: bool, relation: str | None = None
) -> None:
    store.create_run("codasca", {"rounds": 3, **config}, run_id=run_id)
    for round_ in range(4):
        rows = [_row(site, round_, dp, relation) for site in SITES]
        store.record_round(run_id, RoundRecord(round=round_, global_auc=0.6, sites=rows))
    store.finish_run(run_id, "completed", {"selected_round": EXPORTED, "threshold": [0.5]})


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs")
    example = {"dp": "example", "dp_clip": 1.0, "target_epsilon": TARGET, "dp_delta": DELTA}
    with RunStore(path) as store:
        _run(store, "run-dp", example, dp=True)
        _run(store, "run-plain", {}, dp=False)
        update = {"dp_clip": 0.5, "dp_noise": 0.8, "dp_delta": DELTA}
        _run(store, "run-update", update, dp=True, relation=REPLACE_ONE)
        _run(store, "run-update-old", update, dp=True)  # recorded before the store named it
        _run(store, "run-clip", {"dp_clip": 0.5}, dp=False)
    return path


def frame_with(at, column: str) -> pd.DataFrame:
    found = [d.value for d in at.dataframe if column in d.value.columns]
    assert len(found) == 1, [list(d.value.columns) for d in at.dataframe]
    return found[0]


def test_sites_page_shows_each_sites_epsilon_and_who_spent_the_budget(monkeypatch, store_dir):
    at = open_page(monkeypatch, store_dir, "sites", "run-dp")
    text = texts(at)
    assert "Mode: example-level (DP-SGD)" in text and "clip C = 1" in text
    assert f"δ = {DELTA:g}" in text and f"spend ε = {TARGET:g}" in text
    assert "any one of its training examples" in text  # what ε covers, in a sentence
    table = frame_with(at, "ε spent").set_index("site")
    for site, spent in EPSILON.items():
        assert table.loc[site, "ε spent"] == pytest.approx(spent[-1])
        assert table.loc[site, "ε at the exported round"] == pytest.approx(spent[EXPORTED - 1])
        assert table.loc[site, "δ"] == pytest.approx(DELTA)
        assert table.loc[site, "σ"] == pytest.approx(SIGMA[site])
    assert table.loc["north", "budget"] == "spent: stopped at round 3"
    assert (table.drop(index="north")["budget"] == "open").all()
    warnings = [str(w.value) for w in at.warning]
    assert any(w.startswith("north: privacy budget spent") for w in warnings), warnings
    assert f"ε = {EPSILON['north'][-1]:.3f} of target {TARGET:g}" in "\n".join(warnings)
    assert not any(w.startswith(("east", "west")) for w in warnings)
    per_round = frame_with(at, "east")  # the expander's rounds × sites table
    for site, spent in EPSILON.items():
        assert per_round[site].tolist() == pytest.approx(spent)
    assert per_round.index.tolist() == [1, 2, 3]


def test_a_run_without_dp_says_so_in_one_line_and_shows_no_epsilon(monkeypatch, store_dir):
    at = open_page(monkeypatch, store_dir, "sites", "run-plain")
    text = texts(at)
    assert "No differential privacy in this run." in text
    assert "ε" not in text and "Differential privacy" not in text
    assert all("ε spent" not in d.value.columns for d in at.dataframe)


def test_update_level_dp_shows_each_sites_site_level_epsilon(monkeypatch, store_dir):
    at = open_page(monkeypatch, store_dir, "sites", "run-update")
    text = texts(at)
    assert "Mode: update-level (site-level ε) · clip C = 0.5 · noise: σ = 0.8" in text
    assert f"δ = {DELTA:g}" in text
    assert "site's whole dataset, all its patients together" in text  # what ε covers
    assert f"ε is for the neighbouring relation: **{REPLACE_ONE}**" in text
    assert "with few sites the noise a small ε needs is large" in text
    table = frame_with(at, "ε spent").set_index("site")
    for site, spent in EPSILON.items():
        assert table.loc[site, "ε spent"] == pytest.approx(spent[-1])
        assert table.loc[site, "ε at the exported round"] == pytest.approx(spent[EXPORTED - 1])
    assert table.loc["north", "budget"] == "spent: stopped at round 3"
    per_round = frame_with(at, "east")
    for site, spent in EPSILON.items():
        assert per_round[site].tolist() == pytest.approx(spent)


def test_an_older_runs_epsilon_names_the_relation_it_was_computed_for(monkeypatch, store_dir):
    text = texts(open_page(monkeypatch, store_dir, "sites", "run-update-old"))
    assert "relation: **add or remove one hospital's whole training data (recorded before" in text
    text = texts(open_page(monkeypatch, store_dir, "sites", "run-dp"))
    assert "ε is for the neighbouring relation: **add or remove one training example" in text


def test_clipping_without_noise_shows_its_clip_and_says_no_epsilon(monkeypatch, store_dir):
    at = open_page(monkeypatch, store_dir, "sites", "run-clip")
    text = texts(at)
    assert "Mode: update-level (clipping only) · clip C = 0.5 · noise: none" in text
    assert "no differential privacy: no ε" in text and "δ =" not in text
    assert all("ε spent" not in d.value.columns for d in at.dataframe)
