"""Image files get the README's validated recipe for the options not given, on both transports.

``fed-auc simulate --data FILE`` without flags used to run the demo's recipe (tiny network, no
warm-up, lr 0.1), which BENCHMARKS.md found stalls the AUC loss on real data; now it runs the
recipe the README and BENCHMARKS.md ran on BreastMNIST (small network, 10 fedavg + CE warm-up
rounds, lr 0.2, recentered head, α's step from the prevalence, best_val:5, flip, negative
floor 0.25). A flag or TOML key given always wins. ``fed-auc coordinator`` settles the same
defaults once the nodes register, and ``--leave-each-out`` holds each site out in turn over
Flower as ``simulate --leave-each-out`` does in-process.

The Flower coordinator's ``run_experiment`` is driven here with in-process ``NodeWorker``s (the
node side of ``fed-auc node``) behind a transport with ``FlowerTransport``'s interface: no
Flower process runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fed_auc.cli import main
from fed_auc.cli.experiment_options import add_simulate_parser, config_from_args
from fed_auc.experiment.config import FILE_RECIPE, SYNTHETIC_RECIPE, ExperimentConfig
from fed_auc.experiment.files import load_experiment
from fed_auc.site import SiteDefinition
from fed_auc.store.run_store import RunStore
from fed_auc.transport.flower import server
from fed_auc.transport.flower.worker import NodeWorker
from tests.support.flower_like import FlowerLikeTransport
from tests.support.paths import ROOT

# The README's recipe for image files (README "Real data", BENCHMARKS.md "Rare positives").
VALIDATED = {
    "model": "small",
    "lr": 0.2,
    "warmup_rounds": 10,
    "warmup_head": "recenter",
    "select": "best_val:5",
    "min_neg_fraction": 0.25,
    "augment": "flip",
}
DEMO = {"model": "tiny", "lr": 0.1, "warmup_rounds": 0, "warmup_head": "keep"}
# Keeps a run short without touching the recipe's options.
QUICK = {"rounds": 1, "local_steps": 1, "batch_size": 8, "image_size": 16, "eval_every": 1}


def _npz(path: Path, n: tuple[int, int, int] = (24, 8, 8), seed: int = 0) -> Path:
    """A MedMNIST-layout npz of 16 px images; positives have a brighter centre."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, size in zip(("train", "val", "test"), n, strict=True):
        y = (rng.random((size, 1)) < 0.35).astype(np.uint8)
        y[0], y[1] = 1, 0  # both classes in every split
        x = rng.integers(0, 120, (size, 16, 16)).astype(np.float32)
        x[:, 5:11, 5:11] += 120 * y[:, :1, None]
        arrays[f"{split}_images"], arrays[f"{split}_labels"] = x.astype(np.uint8), y
    np.savez(path, **arrays)
    return path


def _site_files(root: Path, names: list[str]) -> list[Path]:
    files = []
    for index, name in enumerate(names):
        folder = root / name
        folder.mkdir(parents=True)
        npz = _npz(folder / "site.npz", seed=index + 1)
        path = root / f"{name}.toml"
        path.write_text(
            f'name = "{name}"\n\n[data]\nspec = "medmnist:{npz}"\n\n'
            f'[node]\nstate_dir = "{root / "state" / name}"\nindex = {index}\n'
        )
        files.append(path)
    return files


def _config(argv: list[str]) -> ExperimentConfig:
    parser = argparse.ArgumentParser()
    add_simulate_parser(parser.add_subparsers(dest="command"))
    return config_from_args(parser.parse_args(["simulate", *argv]))


def _has(config: dict[str, Any], values: dict[str, Any]) -> None:
    assert {k: config[k] for k in values} == values


# -- simulate --------------------------------------------------------------------------------
def test_the_recipes_are_the_ones_the_docs_name():
    assert FILE_RECIPE == {"model": "small", "lr": 0.2, "warmup_rounds": 10, "early_stop": 10}
    assert SYNTHETIC_RECIPE == {"model": "tiny", "lr": 0.1, "warmup_rounds": 0, "early_stop": 0}
    readme = (ROOT / "docs" / "options.md").read_text()
    assert "`small` for image files, `tiny` for synthetic" in readme
    assert "0.2 for image files, 0.1 for synthetic" in readme
    assert "10 for image files" in readme
    assert "10 for image files, 0 (off) for synthetic" in readme  # --early-stop


def test_an_image_file_without_flags_gets_the_validated_recipe_and_synthetic_the_demos():
    files = _config(["--data", "medmnist:x.npz"])
    _has(files.to_dict(), VALIDATED)
    assert files.backend_options == {"dual_lr": "prevalence"}
    _has(_config([]).to_dict(), DEMO)  # the synthetic demo is unchanged
    assert _config([]).backend_options == {}


def test_an_explicit_flag_or_config_key_wins_over_the_image_file_recipe(tmp_path):
    given = _config(["--data", "medmnist:x.npz", "--model", "tiny", "--lr", "0.8",
                     "--warmup-rounds", "0"])  # fmt: skip
    _has(given.to_dict(), {"model": "tiny", "lr": 0.8, "warmup_rounds": 0, "warmup_head": "keep"})
    toml = tmp_path / "experiment.toml"
    toml.write_text('model = "densenet121"\nlr = 0.05\nwarmup_rounds = 3\n')
    from_file = _config(["--config", str(toml), "--data", "medmnist:x.npz"])
    _has(from_file.to_dict(), {"model": "densenet121", "lr": 0.05, "warmup_rounds": 3})
    flag_over_file = _config(["--config", str(toml), "--data", "medmnist:x.npz", "--lr", "0.4"])
    assert flag_over_file.lr == 0.4 and flag_over_file.model == "densenet121"


def test_no_default_warm_up_where_it_cannot_or_need_not_run():
    files = "medmnist:x.npz"
    # a DP accountant forbids training outside it; explicit warm-up there is still refused
    assert ExperimentConfig(data=files, dp_clip=1.0, dp_noise=0.5).warmup_rounds == 0
    assert ExperimentConfig(data=files, dp="example", dp_clip=1.0, dp_noise=1.0).warmup_rounds == 0
    with pytest.raises(ValueError, match="warmup_rounds = 10"):
        ExperimentConfig(data=files, dp_clip=1.0, dp_noise=0.5, warmup_rounds=10)
    assert ExperimentConfig(data=files, dp_clip=1.0).warmup_rounds == 10  # clipping only
    # cross-entropy after a cross-entropy warm-up would only be more rounds of the same
    fedavg = ExperimentConfig(data=files, algorithm="fedavg")
    assert (fedavg.warmup_rounds, fedavg.model, fedavg.lr) == (0, "small", 0.2)
    assert ExperimentConfig(data=files, algorithm="fedavg", loss="auc_margin").warmup_rounds == 10


def test_simulate_on_an_image_file_records_the_validated_recipe(tmp_path, capsys):
    npz = _npz(tmp_path / "data.npz", n=(48, 12, 12))
    quick = [f"--{k.replace('_', '-')}={v}" for k, v in QUICK.items()]
    assert main(["simulate", "--data", f"medmnist:{npz}", "--sites", "2", *quick,
                 "--runs-dir", str(tmp_path / "runs"), "--json"]) == 0  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    with RunStore(tmp_path / "runs") as store:
        runs = store.runs().set_index("id")
        config = store.run(summary["run_id"])["config"]
    _has(config, VALIDATED)
    assert config["backend_options"] == {"dual_lr": "prevalence"}
    assert len(runs) == 2  # the 10-round fedavg + CE warm-up is its own run
    warm = runs.drop(summary["run_id"])
    assert warm["algorithm"].tolist() == ["fedavg"]


# -- over Flower -----------------------------------------------------------------------------
def _coordinator(tmp_path: Path, toml: str, sites: list[str], leave_each_out=False) -> tuple:
    """``fed-auc coordinator --config``'s experiment, run by the ServerApp's own function."""
    files = _site_files(tmp_path / "sites", sites)
    workers = {SiteDefinition.from_toml(f).name: NodeWorker(SiteDefinition.from_toml(f))
               for f in files}  # fmt: skip
    path = tmp_path / "experiment.toml"
    path.write_text(
        f'{toml}\nruns_dir = "{tmp_path / "runs"}"\n\n[flower]\nexpected_sites = {len(sites)}\n'
        f"min_nodes = {len(sites)}\ninsecure = true\npooled_scoring = true\n"
    )
    experiment = load_experiment(path, {})
    config = experiment["experiment"]
    with RunStore(config["runs_dir"]) as store:  # as fed-auc coordinator creates it
        experiment["run_id"] = store.create_run(config["algorithm"], dict(config), None)
    run = server.run_leave_each_out if leave_each_out else server.run_experiment
    summary = run(None, experiment, lambda line: None, lambda g, setup, *a: FlowerLikeTransport(
        files, setup, workers))  # fmt: skip
    return experiment, summary


def test_the_coordinator_settles_the_image_file_recipe_once_the_nodes_register(tmp_path):
    toml = "\n".join(f"{k} = {v}" for k, v in QUICK.items())
    experiment, summary = _coordinator(tmp_path, toml, ["north", "south"])
    assert experiment["experiment"]["lr"] is None  # not known before registration
    with RunStore(tmp_path / "runs") as store:
        config = store.run(summary["run_id"])["config"]
        runs = store.runs()
    _has(config, VALIDATED)
    assert config["backend_options"] == {"dual_lr": "prevalence"}
    assert len(runs) == 2  # the warm-up ran, over the node workers too


def test_the_coordinator_keeps_the_options_its_config_gives(tmp_path):
    toml = "\n".join(f"{k} = {v}" for k, v in QUICK.items())
    toml += '\nmodel = "tiny"\nlr = 0.8\nwarmup_rounds = 0\n'
    _, summary = _coordinator(tmp_path, toml, ["north", "south"])
    with RunStore(tmp_path / "runs") as store:
        config = store.run(summary["run_id"])["config"]
        assert len(store.runs()) == 1
    _has(config, {"model": "tiny", "lr": 0.8, "warmup_rounds": 0, "warmup_head": "keep"})


def test_coordinator_leave_each_out_holds_out_each_registered_site_in_turn(tmp_path):
    toml = "\n".join(f"{k} = {v}" for k, v in QUICK.items())
    toml += '\nmodel = "tiny"\nwarmup_rounds = 0\n'
    sites = ["north", "south", "east"]
    experiment, summary = _coordinator(tmp_path, toml, sites, leave_each_out=True)
    rows = summary["leave_each_out"]
    assert [r["site"] for r in rows] == sites
    assert {r["in_federation_run"] for r in rows} == {experiment["run_id"]}
    assert len({r["held_out_run"] for r in rows}) == 3
    with RunStore(tmp_path / "runs") as store:
        assert set(store.runs()["status"]) == {"completed"} and len(store.runs()) == 4
        for row in rows:
            recorded = store.run(row["held_out_run"])["config"]
            assert recorded["hold_out"] == [row["site"]] and recorded["transport"] == "flower"
            trained = set(store.site_rounds(row["held_out_run"]).query("round > 0")["site"])
            assert trained == set(sites) - {row["site"]}  # never asked to train
            held = store.evaluation_sites(row["held_out_run"]).set_index("site")
            assert held.loc[row["site"], "held_out"] == 1
            assert row["held_out_auc"] is not None and row["in_federation_auc"] is not None
        inside = store.evaluation_sites(experiment["run_id"])
        assert inside["held_out"].eq(0).all() and sorted(inside["site"]) == sorted(sites)


def test_coordinator_leave_each_out_refuses_hold_out_and_resume(tmp_path):
    pytest.importorskip("flwr")
    toml = tmp_path / "x.toml"
    toml.write_text("[flower]\ninsecure = true\n")
    for extra in (["--hold-out", "north"], []):
        argv = ["coordinator", "--leave-each-out", *extra]
        argv += ["--config", str(toml)] if extra else ["--resume", "r1"]
        with pytest.raises(SystemExit, match="--leave-each-out chooses the held-out sites"):
            main(argv)
