"""What a run says about itself: one headline AUC (the exported model's, with the last round
named as such), the positive class by name, and the data it really ran on."""

from __future__ import annotations

import json

import pytest

from fed_auc.cli import main
from tests import dashboard_store


def test_runs_prints_the_exported_auc_with_its_round_and_the_last_round(tmp_path, capsys):
    ids = dashboard_store.fill(tmp_path)
    assert main(["runs", "--runs-dir", str(tmp_path)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    complete = lines[ids["complete"]]
    # the model card's number first, its round named; the last round's after it, named too
    last = dashboard_store._round(2, {"south": "dropped"}).global_auc
    assert f"exported model (round {dashboard_store.EXPORTED_ROUND}) AUC 0.610" in complete
    assert f"last round (2) {last:.3f}" in complete
    assert complete.index("exported model") < complete.index("last round")
    # a run that exported nothing (failed) reports its last round, named as such
    assert "last round (0) AUC" in lines[ids["failed"]]
    assert "no exported model" in lines[ids["failed"]]

    assert main(["runs", "--runs-dir", str(tmp_path), "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    row = rows[ids["complete"]]
    assert row["auc"] == row["exported_auc"] == pytest.approx(0.61)
    assert row["auc_of"] == f"exported model (round {dashboard_store.EXPORTED_ROUND})"
    assert row["exported_round"] == dashboard_store.EXPORTED_ROUND
    assert row["last_round"] == 2 and row["last_round_auc"] == pytest.approx(last)
    assert rows[ids["failed"]]["auc_of"] == "last round"


def test_the_simulate_summary_line_leads_with_the_exported_model():
    from fed_auc.headline import summary_headline

    summary = {"global_auc": [0.5, 0.8, 0.889], "exported_auc": 0.885, "selected_round": 1}
    assert summary_headline(summary) == "exported model (round 1) AUC 0.885; last round (2) 0.889"
    summary |= {"averaged_rounds": [1, 2]}
    assert summary_headline(summary).startswith("exported model (mean of rounds [1, 2]) AUC 0.885")
