"""The evaluation job over Flower: three hospitals score a model on their own files.

One federation of three `fed-auc node` processes serves every check: a hold-out training run
(the held-out node never receives a training request, its own log says so, and it is scored
afterwards); `fed-auc evaluate --federation` equals local `fed-auc evaluate` on the same site
files (AUC, bootstrap CI with the same seed, ROC points, operating-point figures; pooled within
the binning's stated error of the exact pooled AUC); and a node killed mid-evaluation is
recorded by name and reason while the others report.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from fed_auc.evaluate.compare import compare_models
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.metrics.paired import FIXED_EFFECT
from fed_auc.registry.load import load_registered_model
from fed_auc.simulation import run_simulation
from fed_auc.site import SiteDefinition
from fed_auc.store.run_store import RunStore
from fed_auc.transport.flower.processes import free_port
from tests.support.data_files import write_npz
from tests.support.flower_files import _csv_site, _fed_auc, _site_file

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TRAIN = {"rounds": 2, "local_steps": 2, "batch_size": 8, "image_size": 28, "select": "last"}
SITES = ("pngs", "npz_a", "npz_b")


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluation")
    _csv_site(root, "pngs", 48, dicom=False)
    for seed, name in enumerate(("npz_a", "npz_b")):
        (root / name).mkdir()
        # a faint signal: scores overlap, so AUC, CI and ROC are not trivially 1
        write_npz(root / name / "site.npz", n=(40, 12, 30), seed=seed, signal=25)
    files = [
        _site_file(root, "pngs", "csv:pngs/labels.csv"),
        _site_file(root, "npz_a", "medmnist:npz_a/site.npz"),
        _site_file(root, "npz_b", "medmnist:npz_b/site.npz"),
    ]
    port = free_port()
    nodes = {
        f.stem: _fed_auc(root, f"{f.stem}.log", "node", "--site", str(f), "--insecure",
                         "--coordinator", f"127.0.0.1:{port}")
        for f in files
    }  # fmt: skip
    config = ['runs_dir = "runs"'] + [f"{k} = {json.dumps(v)}" for k, v in TRAIN.items()]
    flower = {"address": f"127.0.0.1:{port}", "expected_sites": 3, "min_nodes": 2,
              "insecure": True, "pooled_scoring": True, "eval_timeout_s": 60}  # fmt: skip
    config += ["[flower]"] + [f"{k} = {json.dumps(v)}" for k, v in flower.items()]
    (root / "federation.toml").write_text("\n".join(config) + "\n")
    yield root, files, nodes
    for node in nodes.values():
        if node.poll() is None:
            node.terminate()
    for node in nodes.values():
        node.wait(timeout=60)


def _run(root: Path, log: str, *args: str, timeout: float = 600) -> str:
    process = _fed_auc(root, log, *args)
    assert process.wait(timeout=timeout) == 0, (root / log).read_text()[-4000:]
    return (root / log).read_text()


def test_a_held_out_hospital_never_trains_and_is_scored_afterwards(federation):
    root, _, _ = federation
    text = _run(root, "holdout.log", "coordinator", "--config", "federation.toml",
                "--hold-out", "npz_b", "--json")  # fmt: skip
    summary = json.loads(text[text.index('{\n  "run_id"') :])
    node_log = (root / "npz_b.log").read_text()
    assert "registered for run" in node_log
    assert " train:" not in node_log and "steps" not in node_log  # no training request
    assert f"evaluation job {summary['run_id']}" in node_log  # but scored afterwards
    for other in ("pngs", "npz_a"):
        assert "train:" in (root / f"{other}.log").read_text()
    assert summary["evaluation"]["held_out"] == ["npz_b"]
    assert summary["evaluation"]["auc"]["test"]["npz_b"][0] is not None
    with RunStore(root / "runs") as store:
        rows = store.evaluation_sites(summary["run_id"]).set_index("site")
        trained = set(store.site_rounds(summary["run_id"])["site"])
    assert trained == {"pngs", "npz_a"}
    assert rows.loc["npz_b", "held_out"] == 1 and rows.loc["npz_b", "status"] == "reported"


def test_federated_evaluate_equals_local_evaluate_on_the_same_files(federation):
    root, files, _ = federation
    config = ExperimentConfig(
        **TRAIN, site_files=[str(f) for f in files], runs_dir=str(root / "sim")
    )
    model = run_simulation(config)["model_path"]
    _run(root, "federated.log", "evaluate", "--model", model, "--federation", "federation.toml",
         "--bootstrap", "300", "--seed", "5", "--out", "federated")  # fmt: skip
    sites = [arg for f in files for arg in ("--site", str(f))]
    _run(root, "local.log", "evaluate", "--model", model, *sites, "--bootstrap", "300",
         "--seed", "5", "--out", "local", "--runs-dir", "local-runs")  # fmt: skip
    federated = json.loads((root / "federated" / "evaluation.json").read_text())
    local = json.loads((root / "local" / "evaluation.json").read_text())
    label = local["label_names"][0]
    for site in SITES:
        ours, theirs = federated["sites"][site][label], local["sites"][site][label]
        assert ours["n"] == theirs["n"] > 0 and ours["positives"] == theirs["positives"]
        for key in ("auc", "ci_lo", "ci_hi", "sensitivity", "specificity", "ppv", "npv",
                    "sensitivity_at_spec_90", "sensitivity_at_spec_95", "brier"):  # fmt: skip
            assert ours[key] == pytest.approx(theirs[key], abs=1e-6), (site, key)
        for key in ("fpr", "tpr", "threshold"):
            assert ours["roc"][key] == pytest.approx(theirs["roc"][key], abs=1e-6)
        assert ours["bins"]["positives"] == theirs["bins"]["positives"]
    pooled = federated["sites"]["pooled"][label]
    assert pooled["auc"] == pytest.approx(local["pooled_from_bins"][label]["auc"], abs=1e-12)
    exact = local["sites"]["pooled"][label]["auc"]
    assert abs(pooled["auc"] - exact) <= pooled["auc_error_bound"] + 1e-12
    assert federated["held_out"] == []  # every site trained the model
    assert not federated["failures"]
    assert (root / "federated" / "roc.png").is_file() and (
        root / "federated" / "evaluation.csv"
    ).is_file()
    with RunStore(root / "runs") as store:
        job = store.evaluations().iloc[0]
        rows = store.evaluation_sites(job["run_id"])
    assert job["transport"] == "flower" and job["model"] == str(Path(model).resolve())
    with RunStore(root / "local-runs") as store:  # local evaluate records the same job
        (ours,) = store.evaluations().to_dict("records")
        our_rows = store.evaluation_sites(ours["run_id"])
    same = ["model", "model_run_id", "label_names", "held_out", "failures"]
    assert {k: ours[k] for k in same} == {k: job[k] for k in same}
    columns = ["site", "held_out", "status", "reason"]
    assert our_rows[columns].equals(rows[columns]) and list(rows["site"]) == sorted(SITES)
    for ours_, theirs in zip(our_rows["labels"], rows["labels"], strict=True):
        ours_, theirs = json.loads(ours_)[label], json.loads(theirs)[label]
        assert ours_["n"] == theirs["n"] and ours_["auc"] == pytest.approx(theirs["auc"], abs=1e-6)


def test_two_models_are_compared_at_the_nodes_as_they_are_compared_here(federation):
    """`fed-auc evaluate --federation --compare-to`: each node's paired difference equals the
    local comparison of the same two models on the same site files; the rows are recorded
    under the models' runs, a fixed-effect row in place of a pooled one."""
    root, files, _ = federation
    runs = str(root / "pair")
    paths = [
        run_simulation(ExperimentConfig(**TRAIN, algorithm=algorithm, runs_dir=runs,
                                        site_files=[str(f) for f in files]))["model_path"]
        for algorithm in ("fedavg", "codasca")
    ]  # fmt: skip
    text = _run(root, "compare.log", "evaluate", "--model", paths[0], "--compare-to", paths[1],
                "--federation", "federation.toml", "--out", "compared")  # fmt: skip
    compared = json.loads((root / "compared" / "comparison.json").read_text())
    loaded = [load_registered_model(p) for p in paths]
    cards = (loaded[0][1], loaded[1][1])
    tests = {}
    for f in files:
        site = SiteDefinition.from_toml(f)
        tests[site.name] = site.load(cards[0]["image_size"], 1, cards[0]["seed"]).test
    local = {r["site"]: r for r in compare_models((loaded[0][0], loaded[1][0]), cards, tests)}
    assert [r["site"] for r in compared["rows"]] == [*sorted(SITES), FIXED_EFFECT]
    for row in compared["rows"][:-1]:
        for key in ("auc_a", "auc_b", "difference", "lo", "hi", "se", "p_value", "n"):
            assert row[key] == pytest.approx(local[row["site"]][key], abs=1e-6), (row, key)
    assert f"{FIXED_EFFECT}: difference " in text and "site pngs: AUC A " in text
    with RunStore(root / "runs") as store:
        recorded = store.comparisons(cards[0]["run_id"], cards[1]["run_id"])
    assert list(recorded["site"]) == [*sorted(SITES), FIXED_EFFECT]
    assert "comparison " in (root / "npz_a.log").read_text()  # each node scored both models


def test_a_node_killed_mid_evaluation_is_recorded_and_the_others_report(federation):
    root, files, nodes = federation
    model = next((root / "sim").glob("*/model/model.pt"))
    # A bootstrap large enough that the nodes are still computing when one is killed.
    process = _fed_auc(root, "killed.log", "evaluate", "--model", str(model), "--federation",
                       "federation.toml", "--bootstrap", "1000000", "--out", "killed")  # fmt: skip
    deadline = time.monotonic() + 300
    while "asking each for its report" not in (root / "killed.log").read_text():
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    os.killpg(nodes["npz_a"].pid, signal.SIGKILL)
    assert process.wait(timeout=400) == 0, (root / "killed.log").read_text()[-4000:]
    results = json.loads((root / "killed" / "evaluation.json").read_text())
    assert set(results["failures"]) == {"npz_a"}
    status, _, reason = results["failures"]["npz_a"].partition(": ")
    assert status in ("dropped", "error") and reason  # Flower may call it unavailable
    assert {"pngs", "npz_b"} <= set(results["sites"])
    assert results["sites"]["pooled"][results["label_names"][0]]["pooled_sites"] == [
        "npz_b",
        "pngs",
    ]
    with RunStore(root / "runs") as store:
        run_id = store.evaluations().iloc[0]["run_id"]
        rows = store.evaluation_sites(run_id).set_index("site")
    assert rows.loc["npz_a", "status"] == status
    assert (rows.drop(index="npz_a")["status"] == "reported").all()
