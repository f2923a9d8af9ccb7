"""The numbers a person reads on a console: every AUC names its positive class (and its
interval's method); ``fed-auc runs`` says what each run ran on; the result line reports the
exported model's figures, its worst site included; the progress bar counts the warm-up and
estimates the time left from the recent rounds."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from fed_auc.cli import main
from fed_auc.metrics.wording import selected_text
from fed_auc.store.records import RoundRecord
from tests.support import dashboard_store
from tests.support.data_files import breast_site_files

MALIGNANT = "positive class malignant"
TINY = {"model": "tiny", "image_size": 16, "local_steps": 2, "batch_size": 8, "lr": 0.01}


def _auc_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.search(r"AUC \d\.\d{3}", line)]


def test_simulate_evaluate_and_runs_name_the_positive_class_and_the_exported_worst_site(
    tmp_path, capsys
):
    files = breast_site_files(tmp_path)
    runs, sites = tmp_path / "runs", [x for f in files for x in ("--site", str(f))]
    options = ["--model", "tiny", "--image-size", "16", "--local-steps", "2", "--batch-size",
               "8", "--lr", "0.01", "--rounds", "2", "--select", "best_val"]  # fmt: skip
    assert main(["simulate", *sites, *options, "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("run ")]
    assert MALIGNANT in line
    # the worst site beside the exported model is the exported model's (its card's), named
    model_dir = Path(out.split("model and model card: ")[1].split()[0])
    card = json.loads((model_dir / "model_card.json").read_text())
    worst = min((s for s in card["sites"] if s["auc"] is not None), key=lambda s: s["auc"])
    assert worst["auc"] == pytest.approx(card["worst_site_auc"])
    # the round, and its stage when the export chose a warm-up round (lr 0.01: it may)
    exported = f"exported model ({selected_text(card['selected'])}): pooled test AUC "
    assert f"{exported}{card['global_auc']:.3f}, {MALIGNANT}" in line
    assert f"worst site {worst['site']} AUC {worst['auc']:.3f} [{worst['auc_lo']:.3f}, " in line
    assert "(Hanley–McNeil)" in line and "worst site at the last round" not in line

    assert main(["evaluate", "--model", str(model_dir), *sites, "--out", str(tmp_path / "ev"),
                 "--runs-dir", str(runs), "--bootstrap", "20"]) == 0  # fmt: skip
    lines = _auc_lines(capsys.readouterr().out)
    assert len(lines) == 4  # three sites and the pooled entry
    for text in lines:
        assert MALIGNANT in text and " test n " in text, text
        assert "(bootstrap" in text, text  # the interval's method, beside it

    assert main(["runs", "--runs-dir", str(runs)]) == 0
    listed = capsys.readouterr().out.splitlines()
    trained = next(x for x in listed if x.startswith(card["run_id"]))
    assert "data site files · local · 3 sites (east, north, south)" in trained
    assert MALIGNANT in trained and f"worst site {worst['site']}" in trained
    job = next(x for x in listed if " evaluate " in x)
    assert f"evaluation job of run {card['run_id']}'s model: pooled test AUC" in job
    # a local job pooled the scores themselves: a plain bootstrap (binned counts are the
    # federated job's, tests/e2e/test_flower_evaluation_e2e.py)
    assert "(bootstrap)" in job and MALIGNANT in job


def test_the_coordinator_and_node_consoles_name_the_positive_class(tmp_path):
    """Over the node path (Flower's frames without Flower): the coordinator's lines per round,
    warm-up included, its result line, and every node's evaluation lines."""
    from fed_auc.run.headline import summary_headline
    from fed_auc.site import SiteDefinition
    from fed_auc.store.run_store import RunStore
    from fed_auc.transport.flower import server
    from fed_auc.transport.flower.worker import NodeWorker
    from tests.support.flower_like import FlowerLikeTransport

    files = breast_site_files(tmp_path)
    coordinator: list[str] = []
    nodes: list[str] = []
    workers = {}
    for path in files:
        site = SiteDefinition.from_toml(path)
        workers[site.name] = NodeWorker(site, echo=nodes.append)

    def transport(grid, setup, settings, log, event, identities=None):
        return FlowerLikeTransport(files, setup, workers)

    runs = tmp_path / "runs"
    config = {**TINY, "rounds": 1, "warmup_rounds": 1, "hold_out": ["east"],
              "transport": "flower", "runs_dir": str(runs)}  # fmt: skip
    flower = {"expected_sites": 3, "min_nodes": 3, "insecure": True, "pooled_scoring": True}
    with RunStore(runs) as store:
        run_id = store.create_run("codasca", config, None)
    experiment = {"experiment": config, "flower": flower, "run_id": run_id}
    summary = server.run_experiment(None, experiment, coordinator.append, transport)

    rounds = [x for x in coordinator if x.startswith(("round ", "warm-up "))]
    assert [x.split(":")[0] for x in rounds] == ["warm-up 1/1", "round 1"]
    for line in rounds:
        assert "pooled AUC" in line and MALIGNANT in line, line
    assert MALIGNANT in summary_headline(summary)  # `fed-auc coordinator`'s result line
    evaluated = [x for x in nodes if "evaluated" in x]
    jobs = [x for x in nodes if "evaluation job" in x]
    assert evaluated and jobs  # every round's scoring, and the export scored at every site
    for line in evaluated + jobs:
        assert MALIGNANT in line, line
    for line in jobs:
        assert "(bootstrap)" in line or "undefined" in line, line


def test_leave_each_out_lines_name_the_positive_class_model_and_split(capsys):
    from fed_auc.cli.simulate import print_leave_each_out
    from fed_auc.run.holdout import leave_each_out

    def train(held_out: list[str]) -> dict:
        auc = {"a": [0.8], "b": [0.7]}
        if held_out:
            auc = {held_out[0]: [0.6]}
        run_id = f"without-{held_out[0]}" if held_out else "all"
        evaluation = {"auc": {"test": auc}}
        return {"run_id": run_id, "evaluation": evaluation, "sites": ["a", "b"],
                "positive_class": ["malignant"]}  # fmt: skip

    print_leave_each_out(leave_each_out(None, train))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert "held out: test AUC 0.600 (exported model of run without-a)" in lines[0]
    assert "in federation: test AUC 0.800 (run all)" in lines[0]
    for line in lines:
        assert line.endswith(MALIGNANT), line


def test_runs_lists_data_transport_sites_and_the_positive_class(tmp_path, capsys):
    ids = dashboard_store.fill(tmp_path)
    assert main(["runs", "--runs-dir", str(tmp_path)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    complete = lines[ids["complete"]]
    assert "data synthetic · flower · 4 sites (east, north, south, west)" in complete
    assert "positive class finding present" in complete
    assert "positive class not recorded" in lines[ids["failed"]]  # no cards, no site_data

    assert main(["runs", "--runs-dir", str(tmp_path), "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    row = rows[ids["complete"]]
    assert row["data"] == "synthetic" and row["transport"] == "flower"
    assert row["sites"] == ["east", "north", "south", "west"]
    assert row["positive_class"] == ["finding present"]


# -- the progress bar ------------------------------------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(round_: int) -> RoundRecord:
    return RoundRecord(round_, global_auc=0.7, worst_site_auc=0.6)


def test_the_time_left_follows_the_recent_rounds_not_the_start_up():
    """An 18-minute run: 3 min of start-up and loading, 10 warm-up rounds of 10 s, 50 AUC
    rounds of 15 s. tqdm's estimate started from the first interval (start-up + warm-up)."""
    from fed_auc.cli.progress import WARMUP, RoundProgress

    assert WARMUP == "warm-up (fedavg + cross-entropy)"
    clock, out = FakeClock(), io.StringIO()
    progress = RoundProgress(60, "codasca", warmup=True, clock=clock, file=out)
    progress.name_class("malignant")  # before the first round: the run starts with the warm-up
    assert str(progress.bar).startswith(f"{WARMUP}, {MALIGNANT}: ")
    clock.now = 180.0
    estimates = []
    for r in range(1, 11):
        clock.now += 10
        progress.warmup_round(_record(r))
        estimates.append(progress.pace.remaining_s())
    shown = str(progress.bar)  # the bar as it reads now
    assert shown.startswith(f"{WARMUP}, {MALIGNANT}: ")
    assert " 10/60 " in shown and f"≈{10 * 50 // 60} min" in shown  # counted: 10/60, not 0/60
    clock.now += 60  # the AUC phase's own start-up
    for r in range(1, 51):
        clock.now += 15
        progress.round(_record(r))
        estimates.append(progress.pace.remaining_s())
    assert str(progress.bar).startswith("codasca, positive class malignant: 100%")
    progress.close()
    assert estimates[0] is None  # no pace yet: the first interval carries the start-up
    for done, left in enumerate(estimates[1:], 2):
        truth_low, truth_high = 10 * (60 - done), 15 * (60 - done)
        assert truth_low <= left <= truth_high, (done, left)
    assert estimates[20] == pytest.approx(15 * (60 - 21))  # recent rounds only: 15 s each



def test_simulate_counts_the_warm_up_on_its_bar(tmp_path, capsys):
    """``fed-auc simulate --warmup-rounds 2 --rounds 2``: the bar runs to 4/4 through the
    warm-up, named as such, with the positive class."""
    args = ["simulate", "--sites", "2", "--rounds", "2", "--warmup-rounds", "2",
            "--local-steps", "1", "--runs-dir", str(tmp_path)]  # fmt: skip
    assert main(args) == 0
    bar = capsys.readouterr().err
    assert "warm-up (fedavg + cross-entropy), positive class finding:" in bar
    assert "2/4" in bar and "4/4" in bar
    assert "codasca, positive class finding: 100%" in bar
