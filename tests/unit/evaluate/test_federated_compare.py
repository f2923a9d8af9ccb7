"""Two models compared at a federation's nodes (``fed-auc evaluate --federation --compare-to``),
the coordinator's side with the Flower stand-in (``tests.support.flower_like``: Flower's frames,
``fed-auc node``'s worker, no SuperLink): each site's rows equal the local comparison of the
same models on the same test images; no pooled row, one fixed-effect row per label; the rows
are recorded under the models' runs and printed as ``fed-auc runs --compare`` prints them;
models that do not score the same labels are refused by name before any node is asked."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from fed_auc.cli import main
from fed_auc.cli.compare import comparison_lines
from fed_auc.cli.evaluate import print_comparison
from fed_auc.evaluate.compare import compare_models
from fed_auc.evaluate.federated_compare import COMPARISON_FILE, comparison_request
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.metrics.paired import FIXED_EFFECT
from fed_auc.registry.load import load_registered_model
from fed_auc.simulation import run_simulation
from fed_auc.site import SiteDefinition
from fed_auc.store.run_store import RunStore
from fed_auc.transport.flower.evaluation import run_evaluation
from tests.support.flower_like import FlowerLikeTransport
from tests.support.flower_worker import _site_toml

SITES = ("county_general", "st_elsewhere")  # 22 and 30 test images, 8 and 6 positive
TINY = dict(rounds=1, local_steps=1, batch_size=8, warmup_rounds=0)


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """Two runs on two hospitals' site files (fedavg, codasca), then their models compared at
    those hospitals' nodes through the stand-in."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("fedcompare")
    files = [_site_toml(root / "files", s, i) for i, s in enumerate(SITES)]
    runs = root / "runs"
    paths = {
        algorithm: run_simulation(ExperimentConfig(
            algorithm=algorithm, site_files=[str(f) for f in files], runs_dir=str(runs), **TINY
        ))["model_path"]
        for algorithm in ("fedavg", "codasca")
    }  # fmt: skip
    job = {"model": paths["fedavg"], "compare_to": paths["codasca"], "splits": ["test"],
           "bootstrap": 0, "seed": 0, "out": str(root / "out")}  # fmt: skip
    config = {"transport": "flower", "runs_dir": str(runs)}
    with RunStore(runs) as store:
        run_id = store.create_run("evaluate", {"evaluation": job, "transport": "flower"}, None)
    flower = {"expected_sites": 2, "min_nodes": 2, "insecure": True}
    experiment = {"experiment": config, "flower": flower, "run_id": run_id, "evaluation": job}

    def transport(grid, setup, settings, log, event, identities=None):
        return FlowerLikeTransport(files, setup)

    summary = run_evaluation(None, experiment, lambda line: None, transport)
    return summary, paths, files, runs


def _local_rows(paths, files):
    """The comparison scored here, on the test images the nodes load (card's size, seed)."""
    loaded = [load_registered_model(paths[a]) for a in ("fedavg", "codasca")]
    cards = (loaded[0][1], loaded[1][1])
    sites = {}
    for f in files:
        site = SiteDefinition.from_toml(f)
        sites[site.name] = site.load(cards[0]["image_size"], 1, cards[0]["seed"]).test
    return compare_models((loaded[0][0], loaded[1][0]), cards, sites)


def test_each_site_s_rows_equal_the_local_comparison_and_no_pooled_row_is_invented(compared):
    summary, paths, files, _ = compared
    rows = summary["comparison"]["rows"]
    local = {r["site"]: r for r in _local_rows(paths, files)}
    assert [r["site"] for r in rows] == [*SITES, FIXED_EFFECT]  # no "pooled": none met
    for row in rows[:2]:
        want = local[row["site"]]
        assert row.keys() == want.keys()
        for key, value in want.items():
            assert row[key] == (pytest.approx(value, abs=1e-9) if isinstance(value, float)
                                else value), (row["site"], key)  # fmt: skip
        assert row["method"] == "DeLong" and row["lo"] is not None
    assert summary["comparison"]["sites"] == list(SITES) and not summary["failures"]


def test_the_combined_row_is_the_inverse_variance_mean_of_the_sites_differences(compared):
    summary, *_ = compared
    *sites, combined = summary["comparison"]["rows"]
    weights = [1 / r["se"] ** 2 for r in sites]
    mean = sum(w * r["difference"] for w, r in zip(weights, sites, strict=True)) / sum(weights)
    se = math.sqrt(1 / sum(weights))
    assert combined["site"] == FIXED_EFFECT and combined["auc_a"] is combined["auc_b"] is None
    assert combined["difference"] == pytest.approx(mean)
    assert combined["se"] == pytest.approx(se)
    assert combined["lo"] == pytest.approx(mean - 1.959963984540054 * se)
    assert combined["n"] == sum(r["n"] for r in sites)
    assert "fixed-effect mean" in combined["reason"] and all(s in combined["reason"] for s in SITES)


def test_the_rows_are_recorded_under_the_models_runs_and_written(compared, capsys):
    summary, paths, _, runs = compared
    cards = [load_registered_model(paths[a])[1] for a in ("fedavg", "codasca")]
    with RunStore(runs) as store:
        recorded = store.comparisons(cards[0]["run_id"], cards[1]["run_id"])
        evaluation = store.run(summary["run_id"])
    assert list(recorded["site"]) == [*SITES, FIXED_EFFECT]
    assert set(recorded["method"]) == {"DeLong"}
    assert evaluation["status"] == "completed"
    written = json.loads(Path(summary["files"]["test"]["json"]).read_text())
    assert written == json.loads(json.dumps(summary["comparison"]))
    assert summary["files"]["test"]["json"].endswith(COMPARISON_FILE)
    main(["runs", "--runs-dir", str(runs)])  # the comparison's own run names what it compared
    (line,) = [x for x in capsys.readouterr().out.splitlines() if summary["run_id"] in x]
    assert f"comparison job: runs {cards[0]['run_id']} (A) and {cards[1]['run_id']} (B)" in line


def test_the_console_prints_the_lines_of_runs_compare(compared, capsys):
    summary, *_ = compared
    comparison = json.loads(json.dumps(summary["comparison"]))  # as read back from the file
    print_comparison(comparison)
    lines = capsys.readouterr().out.splitlines()
    assert lines == comparison_lines(comparison, comparison["rows"])
    assert lines[0].startswith("A = fedavg run ") and "test split of 2 site(s)" in lines[0]
    assert lines[1].startswith("site county_general: AUC A ") and "(DeLong, 95 %" in lines[1]
    assert lines[-1].startswith(f"{FIXED_EFFECT}: difference ")
    assert "fixed-effect mean of the per-site differences" in lines[-1]


def test_models_on_other_labels_are_refused_before_any_node_is_asked(compared, tmp_path):
    _, paths, _, _ = compared
    other = tmp_path / "other"
    shutil.copytree(Path(paths["codasca"]).parent, other)
    card = json.loads((other / "model_card.json").read_text())
    (other / "model_card.json").write_text(json.dumps({**card, "label_names": ["other"]}))
    with pytest.raises(ValueError, match=r"models A \(.*\) and B \(.*\) score different labels"):
        comparison_request(paths["fedavg"], other)
    with pytest.raises(SystemExit, match="--compare-to: models A .* score different labels"):
        main(["evaluate", "--model", paths["fedavg"], "--compare-to", str(other),
              "--federation", str(tmp_path / "no.toml"), "--out", str(tmp_path)])  # fmt: skip
    with pytest.raises(SystemExit, match="--compare-to compares at a federation's nodes"):
        main(["evaluate", "--model", paths["fedavg"], "--compare-to", paths["codasca"],
              "--out", str(tmp_path / "o")])  # fmt: skip
