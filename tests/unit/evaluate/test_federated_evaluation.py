"""The evaluation job in-process: hold-out, equality with local evaluate, failing sites."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from fed_auc.cli import main
from fed_auc.coordinator.errors import FederationError
from fed_auc.data.base import SiteData, Split
from fed_auc.data.cards import site_summary
from fed_auc.evaluate.job import model_request, record_and_write, run_job
from fed_auc.evaluate.local import evaluate_model
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.metrics.report import POOLED
from fed_auc.node.build import build_node
from fed_auc.node.node import Node
from fed_auc.node.setup import SiteHosting
from fed_auc.registry.load import load_registered_model
from fed_auc.run.holdout import TrainingSites
from fed_auc.simulation import load_in_process_sites, run_simulation
from fed_auc.site import load_site_files
from fed_auc.store.run_store import RunStore
from fed_auc.transport.local import LocalTransport
from tests.support.data_files import write_npz

TINY = {"sites": 3, "rounds": 2, "local_steps": 2, "batch_size": 16, "data_scale": 0.4}


def _nodes(config: ExperimentConfig, sites: list[SiteData], root: Path) -> list[Node]:
    """Real in-process nodes over ``sites`` (the job needs only their data)."""
    setup = config.node_setup("job", {"arch": "tiny", "num_labels": 1}, 1, len(sites))
    return [
        build_node(setup, s, SiteHosting(s.name, i), root / s.name) for i, s in enumerate(sites)
    ]


@pytest.fixture(scope="module")
def held_out_run(tmp_path_factory):
    """A 3-site synthetic federation trained without its second site, recording who trained."""
    root = tmp_path_factory.mktemp("holdout")
    config = ExperimentConfig(**TINY, runs_dir=str(root))
    names = [s.data.name for s in load_in_process_sites(config)[0]]
    trained: list[str] = []
    original = Node.train

    def spy(self, broadcast):
        trained.append(self.name)
        return original(self, broadcast)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Node, "train", spy)
        summary = run_simulation(dataclasses.replace(config, hold_out=[names[1]]))
    return summary, names, trained, config


def test_a_held_out_site_never_trains_and_is_scored_afterwards(held_out_run):
    summary, names, trained, config = held_out_run
    held = names[1]
    assert trained and held not in trained and set(trained) == {names[0], names[2]}
    _, card = load_registered_model(summary["model_path"])
    assert held not in {row["site"] for row in card["sites"]}  # the card says what it saw
    evaluation = summary["evaluation"]
    assert evaluation["held_out"] == [held]
    assert set(evaluation["auc"]["test"]) == {*names, POOLED}
    assert evaluation["auc"]["test"][held][0] is not None
    with RunStore(config.runs_dir) as store:
        rows = store.evaluation_sites(summary["run_id"]).set_index("site")
        job = store.evaluations().set_index("run_id").loc[summary["run_id"]]
    assert rows.loc[held, "held_out"] == 1 and rows.loc[held, "status"] == "reported"
    assert rows.drop(index=held)["held_out"].eq(0).all()
    assert json.loads(job["held_out"]) == [held] and job["model_run_id"] == summary["run_id"]
    written = json.loads(Path(evaluation["files"]["test"]["json"]).read_text())
    assert written["held_out"] == [held]


def test_hold_out_of_an_unknown_site_is_refused_by_name(tmp_path):
    config = ExperimentConfig(**TINY, runs_dir=str(tmp_path), hold_out=["nowhere"])
    with pytest.raises(ValueError, match=r"hold_out: unknown site\(s\) \['nowhere'\]"):
        run_simulation(config)


def _sites(config: ExperimentConfig) -> list[SiteData]:
    return [s.data for s in load_in_process_sites(config)[0]]


def test_the_job_equals_local_evaluate_per_site_and_pools_within_the_stated_error(
    held_out_run, tmp_path
):
    summary, _, _, config = held_out_run
    sites = _sites(config)
    model, card = load_registered_model(summary["model_path"])
    local = evaluate_model(model, card, {s.name: s.test for s in sites}, n_boot=200, seed=3)
    request, tensors, _ = model_request(summary["model_path"], ["test"], 200, 3)
    nodes = _nodes(config, sites, tmp_path)
    federated = run_job(LocalTransport(nodes), [s.name for s in sites], request, tensors, [])
    federated = federated["test"]
    for site in sites:  # AUC, bootstrap CI, ROC points, operating point, bins: all equal
        assert federated["sites"][site.name] == local["sites"][site.name]
    for label in card["label_names"]:
        pooled = federated["sites"][POOLED][label]
        assert pooled["auc"] == local["pooled_from_bins"][label]["auc"]
        assert (pooled["ci_lo"], pooled["ci_hi"]) == (
            local["pooled_from_bins"][label]["ci_lo"],
            local["pooled_from_bins"][label]["ci_hi"],
        )
        exact = local["sites"][POOLED][label]["auc"]  # per-image scores pooled: local only
        assert abs(pooled["auc"] - exact) <= pooled["auc_error_bound"]
        assert pooled["n"] == local["sites"][POOLED][label]["n"]
        assert pooled["tp"] == local["sites"][POOLED][label]["tp"]  # counts at the threshold
        assert pooled["pooled_sites"] == sorted(s.name for s in sites)


def _one_class(site: SiteData) -> SiteData:
    test = Split(site.test.images, torch.zeros_like(site.test.labels))
    return dataclasses.replace(site, test=test)


def _broken(site: SiteData) -> SiteData:
    """Images the model cannot take (three channels): scoring raises on that node only."""
    images = site.test.images.repeat(1, 3, 1, 1)
    test = object.__new__(Split)
    test.images, test.labels = images, site.test.labels
    return dataclasses.replace(site, test=test)


def test_one_class_and_crashing_sites_are_reported_by_name_and_the_others_still_report(
    held_out_run, tmp_path
):
    summary, _, _, config = held_out_run
    a, b, c = _sites(config)
    nodes = _nodes(config, [a, _one_class(b), _broken(c)], tmp_path / "nodes")
    request, tensors, card = model_request(summary["model_path"], ["test"], 50, 0)
    results = run_job(LocalTransport(nodes), [a.name, b.name, c.name], request, tensors, [])
    test = results["test"]
    label = card["label_names"][0]
    assert test["sites"][a.name][label]["auc"] is not None
    assert test["sites"][b.name][label]["auc"] is None
    assert test["sites"][b.name][label]["note"] == "AUC undefined: no positives"
    assert c.name not in test["sites"] and test["failures"][c.name].startswith("error: ")
    assert test["sites"][POOLED][label]["pooled_sites"] == sorted([a.name, b.name])
    with RunStore(tmp_path) as store:
        run_id = store.create_run("evaluate", {}, None)
        record_and_write(store, run_id, results, "m", card, "local", tmp_path / "out")
        rows = store.evaluation_sites(run_id).set_index("site")
        events = " ".join(store.events(run_id)["message"])
    assert rows.loc[c.name, "status"] == "error"
    assert "ValueError: expected images of shape" in rows.loc[c.name, "reason"]
    assert rows.loc[b.name, "status"] == "reported"
    assert f"site {c.name} did not report" in events


def test_a_model_format_the_nodes_do_not_know_is_reported_per_site(held_out_run, tmp_path):
    summary, _, _, config = held_out_run
    sites = _sites(config)
    request, tensors, _ = model_request(summary["model_path"], ["test"], 0, 0)
    request = dataclasses.replace(request, model_format="fed-auc-model/99")
    nodes = _nodes(config, sites, tmp_path)
    test = run_job(LocalTransport(nodes), [s.name for s in sites], request, tensors, [])["test"]
    assert set(test["failures"]) == {s.name for s in sites}
    assert all("unknown model format 'fed-auc-model/99'" in m for m in test["failures"].values())


def test_local_evaluate_on_site_files_marks_sites_the_model_never_saw(held_out_run, tmp_path):
    summary, _, _, _ = held_out_run
    files = []
    for seed, name in enumerate(("north", "south")):
        write_npz(tmp_path / f"{name}.npz", n=(20, 10, 40), seed=seed)
        path = tmp_path / f"{name}.toml"
        path.write_text(f'name = "{name}"\n\n[data]\nspec = "medmnist:{name}.npz"\n')
        files += ["--site", str(path)]
    out = tmp_path / "eval"
    main(["evaluate", "--model", summary["model_path"], *files, "--bootstrap", "50",
          "--out", str(out), "--runs-dir", str(tmp_path / "runs")])  # fmt: skip
    results = json.loads((out / "evaluation.json").read_text())
    assert results["held_out"] == ["north", "south"]
    label = results["label_names"][0]
    assert results["pooled_from_bins"][label]["sites"] == ["north", "south"]
    north = results["sites"]["north"][label]
    assert north["n"] == 40 and north["calibration"] and len(north["roc"]["fpr"]) <= 101
    assert sum(c["n"] for c in north["calibration"]) == 40


def _site_files(root: Path, names: tuple[str, ...]) -> list[Path]:
    paths = []
    for seed, name in enumerate(names):
        write_npz(root / f"{name}.npz", n=(20, 10, 40), seed=seed)
        path = root / f"{name}.toml"
        path.write_text(f'name = "{name}"\n\n[data]\nspec = "medmnist:{name}.npz"\n')
        paths.append(path)
    return paths


def _recorded(runs_dir: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame, str]:
    """The one evaluation of a store: its row, its site rows, its sites' data rows, its run."""
    with RunStore(runs_dir) as store:
        (job,) = store.evaluations().to_dict("records")
        run_id = job["run_id"]
        sites = store.evaluation_sites(run_id).drop(columns="run_id")
        cards = store.sites(run_id).drop(columns="run_id")
        status = store.run(run_id)["status"]
    return job, sites, cards, status


def test_local_evaluate_on_site_files_records_the_rows_the_job_records(held_out_run, tmp_path):
    """Same model, same site files: ``fed-auc evaluate --site`` (scored here) and the job at
    in-process nodes over those files record the same evaluation rows."""
    summary, _, _, config = held_out_run
    paths = _site_files(tmp_path, ("north", "south"))
    files = [arg for path in paths for arg in ("--site", str(path))]
    main(["evaluate", "--model", summary["model_path"], *files, "--bootstrap", "50",
          "--seed", "3", "--out", str(tmp_path / "local"),
          "--runs-dir", str(tmp_path / "local_runs")])  # fmt: skip
    local = json.loads((tmp_path / "local" / "evaluation.json").read_text())

    model, card = load_registered_model(summary["model_path"])
    sites = [site.load(card["image_size"], 1, card["seed"]) for site in load_site_files(paths)]
    request, tensors, _ = model_request(summary["model_path"], ["test"], 50, 3)
    nodes = _nodes(config, sites, tmp_path / "nodes")
    held = ["north", "south"]  # the model never saw them
    results = run_job(LocalTransport(nodes), ["north", "south"], request, tensors, held)
    with RunStore(tmp_path / "job_runs") as store:
        run_id = store.create_run("evaluate", {}, None)
        store.record_sites(run_id, {s.name: site_summary(s) for s in sites})
        model_path = str(Path(summary["model_path"]).resolve())
        record_and_write(store, run_id, results, model_path, card, "local", tmp_path / "job")

    ours, our_sites, our_cards, status = _recorded(tmp_path / "local_runs")
    theirs, their_sites, their_cards, _ = _recorded(tmp_path / "job_runs")
    assert status == "completed"
    for key in ("run_id", "recorded_at"):
        ours.pop(key), theirs.pop(key)
    # pooled: the job adds up the nodes' counts; scored here, the scores themselves pool, as
    # the console printed them (test_dashboard_numbers shows the page says so)
    our_pooled, their_pooled = json.loads(ours.pop("pooled")), json.loads(theirs.pop("pooled"))
    label = local["label_names"][0]
    assert our_pooled[label]["pooled_from"] == "scores"
    assert their_pooled[label]["pooled_from"] == "bins"
    for key in ("auc", "ci_lo", "ci_hi", "n", "positives"):
        assert our_pooled[label][key] == local["sites"][POOLED][label][key], key
    assert ours == theirs and ours["transport"] == "local" and ours["model"] == model_path
    assert list(our_sites["site"]) == list(our_cards["site"]) == ["north", "south"]
    pd.testing.assert_frame_equal(our_sites, their_sites)
    pd.testing.assert_frame_equal(our_cards, their_cards)
    # and the recorded rows are what evaluate returned
    assert json.loads(ours["held_out"]) == local["held_out"] == held
    for row in our_sites.itertuples():
        assert row.status == "reported" and row.held_out == 1
        assert json.loads(row.labels) == local["sites"][row.site]
    pooled = their_pooled[label]  # the job's pooled: what evaluate reports from the bins
    assert pooled["auc"] == local["pooled_from_bins"][label]["auc"]
    assert (pooled["ci_lo"], pooled["ci_hi"]) == (
        local["pooled_from_bins"][label]["ci_lo"],
        local["pooled_from_bins"][label]["ci_hi"],
    )


def test_the_validation_split_is_scored_and_written_beside_the_test_split(held_out_run, tmp_path):
    summary, _, _, config = held_out_run
    sites = _sites(config)
    request, tensors, card = model_request(summary["model_path"], ["test", "val"], 20, 0)
    nodes = _nodes(config, sites, tmp_path / "nodes")
    results = run_job(LocalTransport(nodes), [s.name for s in sites], request, tensors, [])
    label = card["label_names"][0]
    for site in sites:
        assert results["val"]["sites"][site.name][label]["n"] == len(site.val)
        assert results["test"]["sites"][site.name][label]["n"] == len(site.test)
    with RunStore(tmp_path) as store:
        run_id = store.create_run("evaluate", {}, None)
        written = record_and_write(store, run_id, results, "m", card, "local", tmp_path / "out")
        assert set(store.evaluations()["split"]) == {"test", "val"}
    assert Path(written["files"]["val"]["json"]) == tmp_path / "out" / "val" / "evaluation.json"
    assert (tmp_path / "out" / "evaluation.csv").is_file()


def test_a_training_request_to_a_held_out_site_is_refused_before_it_leaves():
    class Everyone:
        sites = ["a", "b"]

        def register(self):
            return {"a": {}, "b": {}}

        def train(self, requests):
            raise AssertionError("must not be reached")

    training = TrainingSites(Everyone(), ["b"])
    assert list(training.register()) == ["a"] and training.sites == ["a"]
    with pytest.raises(FederationError, match=r"held-out site\(s\) \['b'\]"):
        training.train({"a": None, "b": None})
    with pytest.raises(ValueError, match="leaves no site to train on"):
        TrainingSites(Everyone(), ["a", "b"]).register()


def test_leave_each_out_sets_each_sites_held_out_auc_beside_its_in_federation_auc(tmp_path, capsys):
    config = tmp_path / "small.toml"
    config.write_text("data_scale = 0.3\n")
    options = ["--sites", "2", "--rounds", "1", "--local-steps", "2", "--batch-size", "16"]
    main(["simulate", "--config", str(config), *options, "--runs-dir", str(tmp_path),
          "--leave-each-out", "--json"])  # fmt: skip
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 and len({r["in_federation_run"] for r in rows}) == 1
    with RunStore(tmp_path) as store:
        for row in rows:
            held = store.evaluation_sites(row["held_out_run"]).set_index("site")
            assert held.loc[row["site"], "held_out"] == 1
            assert held.loc[row["site"], "labels"] is not None
            assert json.loads(held.loc[row["site"], "labels"])["finding"]["auc"] == pytest.approx(
                row["held_out_auc"][0]
            )
            inside = store.evaluation_sites(row["in_federation_run"]).set_index("site")
            assert inside["held_out"].eq(0).all()
