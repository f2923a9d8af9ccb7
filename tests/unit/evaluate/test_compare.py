"""Two runs' exported models compared on the same test images (``fed-auc runs --compare``): a
run against itself differs by exactly zero with zero-width intervals; two runs give the paired
differences of scores computed here independently; runs on other sites or splits are refused
by name; the command prints the lines and records the rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fed_auc.cli import main
from fed_auc.cli.compare import compare_runs
from fed_auc.data.partition import sites_from_manifest
from fed_auc.data.spec import load_pool, parse_data_spec
from fed_auc.data.synthetic import make_synthetic_federation
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.metrics.paired import paired_auc_difference
from fed_auc.registry.load import load_registered_model
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore
from fed_auc.tta import predict
from tests.support.data_files import write_npz

TINY = dict(rounds=1, local_steps=1, batch_size=8)
SYNTHETIC = dict(sites=3, data_scale=0.15, **TINY)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Synthetic runs (two algorithms, and another seed) and two on a MedMNIST file (its
    partition manifest), all in one runs directory."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("compare")
    runs_dir = str(root / "runs")
    npz = write_npz(root / "m.npz", n=(80, 30, 60))
    medmnist = dict(data=f"medmnist:{npz}", partition="dirichlet:1.0", sites=2, image_size=16,
                    warmup_rounds=0, **TINY)  # fmt: skip
    made = {
        "codasca": dict(algorithm="codasca", **SYNTHETIC),
        "fedavg": dict(algorithm="fedavg", **SYNTHETIC),
        "seed1": dict(algorithm="codasca", seed=1, **SYNTHETIC),
        "npz_codasca": dict(algorithm="codasca", **medmnist),
        "npz_fedavg": dict(algorithm="fedavg", **medmnist),
    }
    ids = {
        name: run_simulation(ExperimentConfig(runs_dir=runs_dir, **options))["run_id"]
        for name, options in made.items()
    }
    return runs_dir, ids, npz


def _scores(runs_dir, run_id, images):
    model, card = load_registered_model(f"{runs_dir}/{run_id}/model")
    return predict(model, images, card.get("tta") or "none")


def _synthetic_test_splits():
    sites = make_synthetic_federation(num_sites=3, image_size=28, num_labels=1, seed=0, scale=0.15)
    return {s.name: s.test for s in sites}


def _manifest_test_splits(runs_dir, run_id, npz):
    pool = load_pool(parse_data_spec(f"medmnist:{npz}"), 16)
    manifest = json.loads(open(f"{runs_dir}/{run_id}/partition.json").read())
    return {s.name: s.test for s in sites_from_manifest(pool, manifest)}


def _expected(runs_dir, id_a, id_b, splits):
    """Per site and pooled, paired_auc_difference of the two models' scores, scored here."""
    parts = {}
    for site, split in splits.items():
        images = split.images
        parts[site] = (split.labels.numpy()[:, 0], _scores(runs_dir, id_a, images)[:, 0],
                       _scores(runs_dir, id_b, images)[:, 0])  # fmt: skip
    parts["pooled"] = tuple(np.concatenate(p) for p in zip(*parts.values(), strict=True))
    return {site: paired_auc_difference(*p) for site, p in parts.items()}


@pytest.mark.parametrize("name", ["codasca", "npz_codasca"])
def test_a_run_against_itself_differs_by_exactly_zero_everywhere(runs, name):
    runs_dir, ids, _ = runs
    about, rows = compare_runs(runs_dir, ids[name], ids[name])
    sites = {r["site"] for r in rows}
    assert sites == {*about["sites"], "pooled"} and len(about["sites"]) >= 2
    defined = [r for r in rows if r["lo"] is not None]
    assert {r["site"] for r in defined} >= {"pooled"}
    for row in rows:
        assert row["difference"] == 0.0 and row["auc_a"] == row["auc_b"]
    for row in defined:
        assert row["lo"] == row["hi"] == 0.0 and row["se"] == 0.0


@pytest.mark.parametrize(
    ("a", "b", "splits"),
    [("codasca", "fedavg", "synthetic"), ("npz_codasca", "npz_fedavg", "manifest")],
)
def test_two_runs_give_the_paired_difference_of_independently_scored_images(runs, a, b, splits):
    runs_dir, ids, npz = runs
    about, rows = compare_runs(runs_dir, ids[a], ids[b])
    tests = (_synthetic_test_splits() if splits == "synthetic"
             else _manifest_test_splits(runs_dir, ids[a], npz))  # fmt: skip
    expected = _expected(runs_dir, ids[a], ids[b], tests)
    assert sorted(r["site"] for r in rows) == sorted(expected)
    assert about["sites"] == sorted(tests)
    for row in rows:
        want = expected[row["site"]]
        assert (row["n"], row["positives"]) == (want.n, want.positives)
        for key in ("auc_a", "auc_b", "difference", "lo", "hi", "se", "p_value"):
            got, ref = row[key], getattr(want, key)
            assert (got is None) == (ref is None), (row["site"], key)
            if ref is not None:
                assert got == pytest.approx(ref, abs=1e-6), (row["site"], key)
    pooled = next(r for r in rows if r["site"] == "pooled")
    assert pooled["n"] == sum(len(s.labels) for s in tests.values())
    assert pooled["difference"] != 0.0  # two different models


def test_runs_on_other_sites_or_splits_and_unfinished_runs_are_refused_by_name(runs):
    runs_dir, ids, _ = runs
    with pytest.raises(ValueError, match=r"same sites and split: seed \(it makes the split\)"):
        compare_runs(runs_dir, ids["codasca"], ids["seed1"])
    with pytest.raises(ValueError, match=r"data \('synthetic' vs 'medmnist:.*partition"):
        compare_runs(runs_dir, ids["codasca"], ids["npz_codasca"])
    with RunStore(runs_dir) as store:
        config = store.run(ids["codasca"])["config"]
        running = store.create_run("codasca", config, run_id="still-running")
    with pytest.raises(ValueError, match="run still-running .codasca. is running, not completed"):
        compare_runs(runs_dir, ids["codasca"], running)
    with pytest.raises(KeyError, match="no run 'nope'"):
        compare_runs(runs_dir, ids["codasca"], "nope")


def test_the_command_prints_a_line_per_site_and_the_pooled_one_and_records_them(runs, capsys):
    runs_dir, ids, _ = runs
    a, b = ids["codasca"], ids["fedavg"]
    assert main(["runs", "--compare", a, b, "--runs-dir", runs_dir]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    with RunStore(runs_dir) as store:
        stored = store.comparisons(a, b)
    sites = sorted(stored["site"][stored["site"] != "pooled"])
    assert lines[0] == (
        f"A = codasca run {a}, B = fedavg run {b}: exported models on the test split of 3 "
        f"site(s) ({', '.join(sites)}), positive class finding"
    )
    assert [line.split(":")[0] for line in lines[1:]] == [f"site {s}" for s in sites] + ["pooled"]
    pooled = stored.set_index("site").loc["pooled"]
    assert lines[-1] == (
        f"pooled: AUC A {pooled['auc_a']:.3f} vs B {pooled['auc_b']:.3f}, difference "
        f"{pooled['difference']:+.3f} [{pooled['lo']:+.3f}, {pooled['hi']:+.3f}] (DeLong, 95 %, "
        f"paired on {pooled['n']} test images, {pooled['positives']} positive: finding)"
    )
    assert set(stored["method"]) == {"DeLong"} and set(stored["split"]) == {"test"}
    assert main(["runs", "--compare", a, b, "--runs-dir", runs_dir, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["run_a"] == {"id": a, "algorithm": "codasca"}
    assert [r["difference"] for r in shown["rows"]] == pytest.approx(
        stored["difference"].tolist()
    )
    with pytest.raises(SystemExit, match=r"^fed-auc runs --compare: runs .* seed"):
        main(["runs", "--compare", a, ids["seed1"], "--runs-dir", runs_dir])
