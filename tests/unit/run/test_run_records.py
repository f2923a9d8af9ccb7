"""What a run says about itself: one headline AUC (the exported model's, with the last round
named as such), the positive class by name, and the data it really ran on."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from fed_auc.cli import main
from tests.support import dashboard_store
from tests.support.data_files import breast_site_files


def test_runs_prints_the_exported_auc_with_its_round_and_the_last_round(tmp_path, capsys):
    ids = dashboard_store.fill(tmp_path)
    assert main(["runs", "--runs-dir", str(tmp_path)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    complete = lines[ids["complete"]]
    # the model card's number first, its round named; the last round's after it, named too
    last = dashboard_store._round(2, {"south": "dropped"}).global_auc
    exported = f"exported model (round {dashboard_store.EXPORTED_ROUND}): pooled test AUC 0.610"
    assert exported in complete
    assert f"last round (2): pooled AUC {last:.3f}" in complete
    assert complete.index("exported model") < complete.index("last round")
    # a run that exported nothing (failed) reports its last round, named as such
    assert "last round (0): pooled test AUC" in lines[ids["failed"]]
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
    from fed_auc.run.headline import summary_headline

    summary = {"global_auc": [0.5, 0.8, 0.889], "exported_auc": 0.885, "selected_round": 1,
               "positive_class": ["malignant"]}  # fmt: skip
    assert summary_headline(summary) == (
        "exported model (round 1): pooled test AUC 0.885, positive class malignant; "
        "last round (2): pooled AUC 0.889"
    )
    summary |= {"averaged_rounds": [1, 2]}
    assert summary_headline(summary).startswith(
        "exported model (mean of rounds [1, 2]): pooled test AUC 0.885"
    )


# -- the positive class, by name -------------------------------------------------------------
def test_the_positive_class_is_named_in_cards_evaluation_files_and_the_dashboard(
    tmp_path, monkeypatch, capsys
):
    from fed_auc.data.cards import render_data_card, write_cards
    from fed_auc.experiment.config import ExperimentConfig
    from fed_auc.simulation import run_simulation
    from fed_auc.site import SiteDefinition
    from tests.support.apptest import open_page, texts

    files = breast_site_files(tmp_path)
    site = SiteDefinition.from_toml(files[0])
    assert site.data["positive_label"] == 0 and site.data["positive_class"] == "malignant"
    data = site.load(image_size=16)
    (md,) = write_cards([data], tmp_path / "cards")
    card = json.loads(md.with_suffix(".json").read_text())
    assert card["positive_class"] == ["malignant"]
    assert "Positive class: malignant" in md.read_text() == render_data_card(card)

    runs = tmp_path / "runs"
    summary = run_simulation(
        ExperimentConfig(
            model="tiny",
            image_size=16,
            rounds=2,
            local_steps=2,
            batch_size=8,
            lr=0.01,
            site_files=[str(f) for f in files],
            runs_dir=str(runs),
        )  # fmt: skip
    )
    model_dir = Path(summary["model_path"]).parent
    model_card = json.loads((model_dir / "model_card.json").read_text())
    assert model_card["positive_class"] == ["malignant"]
    assert "Positive class: malignant" in (model_dir / "MODEL_CARD.md").read_text()

    out = tmp_path / "eval"
    args = ["evaluate", "--model", str(model_dir), "--out", str(out), "--runs-dir", str(runs),
            "--bootstrap", "20"]  # fmt: skip
    assert main([*args, *[x for f in files for x in ("--site", str(f))]]) == 0
    capsys.readouterr()
    assert json.loads((out / "evaluation.json").read_text())["positive_class"] == ["malignant"]
    assert set(pd.read_csv(out / "evaluation.csv")["positive_class"]) == {"malignant"}

    for page in ("overview", "sites", "evaluations"):
        at = open_page(monkeypatch, runs, page, summary["run_id"])
        assert "Positive class: malignant" in texts(at), page


def test_the_roc_and_operating_point_pages_name_the_positive_class(tmp_path, monkeypatch):
    from tests.support.apptest import open_page, texts

    ids = dashboard_store.fill(tmp_path)  # its data cards name the class "finding present"
    for page in ("roc", "operating_point", "compare"):
        at = open_page(monkeypatch, tmp_path, page, ids["complete"])
        assert "Positive class: finding present" in texts(at), page
    at = open_page(monkeypatch, tmp_path, "operating_point", ids["complete"])
    assert "sensitivity is the share of its images called positive" in texts(at)


def test_a_derived_positive_class_says_which_label_value_it_is():
    from fed_auc.data.labels import positive_classes

    assert positive_classes(["label"]) == ["label == 1"]
    assert positive_classes(["label"], positive_label=0) == ["label == 0"]
    assert positive_classes(["Cardiomegaly", "Edema"]) == ["Cardiomegaly", "Edema"]
    assert positive_classes(["label"], 0, "malignant") == ["malignant"]
    with pytest.raises(ValueError, match="names 1 class"):
        positive_classes(["a", "b"], None, "malignant")


# -- what a run really ran on ------------------------------------------------------------------
RECORDED = ("data", "sites", "site_files", "site_data")


def test_a_flower_run_records_the_data_it_ran_on_as_an_in_process_run_does(
    tmp_path, monkeypatch, shared_dp_secret
):
    import hashlib

    from app import queries
    from app.tables import differing_settings
    from fed_auc.experiment.config import ExperimentConfig
    from fed_auc.experiment.files import recorded_config
    from fed_auc.simulation import run_simulation
    from fed_auc.store.run_store import RunStore
    from tests.support.data_files import write_npz
    from tests.support.flower_like import _over_worker, _png_csv, _site_files

    (tmp_path / "east").mkdir()
    specs = [
        ("north", f"csv:{_png_csv(tmp_path / 'north', ['label'], seed=1)}"),
        ("south", f"csv:{_png_csv(tmp_path / 'south', ['label'], rows=36, seed=2)}"),
        ("east", f"medmnist:{write_npz(tmp_path / 'east' / 'site.npz', n=(24, 8, 8), seed=3)}"),
    ]
    files = _site_files(tmp_path / "sites", specs, {})
    options = {"model": "tiny", "image_size": 16, "rounds": 1, "local_steps": 1, "batch_size": 8}
    local = run_simulation(
        ExperimentConfig(
            **options, site_files=[str(f) for f in files], runs_dir=str(tmp_path / "a")
        )
    )
    flower, _ = _over_worker(options, files, tmp_path / "b")
    with RunStore(tmp_path / "a") as store:
        want = store.run(local["run_id"])["config"]
    with RunStore(tmp_path / "b") as store:
        got = store.run(flower["run_id"])["config"]

    assert got["data"] == want["data"] == "site files"  # not the unused default "synthetic"
    assert got["sites"] == want["sites"] == 3  # the sites that registered, not the default 4
    assert got["site_files"] == want["site_files"] == [str(f) for f in files]
    assert got["site_data"] == want["site_data"]
    north = got["site_data"]["north"]
    csv_path = specs[0][1].removeprefix("csv:")
    assert north["sha256"] == hashlib.sha256(open(csv_path, "rb").read()).hexdigest()
    assert north["spec"] == f"csv:{csv_path}" and north["positive_class"] == ["label == 1"]
    east = got["site_data"]["east"]
    assert (
        east["sha256"] == hashlib.sha256((tmp_path / "east" / "site.npz").read_bytes()).hexdigest()
    )

    # the dashboard: "site files", 3 sites for both; Compare differs only in the transport
    for runs, run_id in ((tmp_path / "a", local["run_id"]), (tmp_path / "b", flower["run_id"])):
        row = queries.runs(runs).set_index("id").loc[run_id]
        assert row["data_source"] == "site files" and "synthetic" not in row["label"]
        assert " · 3 sites · " in row["label"]
    differ = differing_settings({"local": want, "flower": got}).index.tolist()
    assert not set(differ) & set(RECORDED), differ
    assert set(differ) <= {"transport", "flower", "runs_dir"}, differ  # two stores here

    # a resume reads the recorded config back as options (the record is not an option)
    with RunStore(tmp_path / "b") as store:
        resumed = dict(store.run(flower["run_id"])["config"])
    resumed.pop("flower")
    assert recorded_config(resumed, tmp_path / "b").transport == "flower"
    assert recorded_config(want, tmp_path / "a").site_files == [str(f) for f in files]


def test_an_evaluation_job_records_the_data_it_scored(tmp_path, capsys):
    from fed_auc.experiment.config import ExperimentConfig
    from fed_auc.simulation import run_simulation
    from fed_auc.store.run_store import RunStore

    files = breast_site_files(tmp_path)
    runs = tmp_path / "runs"
    summary = run_simulation(
        ExperimentConfig(
            model="tiny",
            image_size=16,
            rounds=1,
            local_steps=1,
            batch_size=8,
            lr=0.01,
            site_files=[str(f) for f in files],
            runs_dir=str(runs),
        )  # fmt: skip
    )
    model_dir = Path(summary["model_path"]).parent
    args = ["evaluate", "--model", str(model_dir), "--out", str(tmp_path / "eval"),
            "--runs-dir", str(runs), "--bootstrap", "20"]  # fmt: skip
    assert main([*args, *[x for f in files[:2] for x in ("--site", str(f))]]) == 0
    job_id = capsys.readouterr().out.strip().splitlines()[-1].split()[2]
    with RunStore(runs) as store:
        job = store.run(job_id)["config"]
        trained = store.run(summary["run_id"])["config"]
    assert job["data"] == "site files" and job["sites"] == 2
    assert job["site_files"] == [str(f) for f in files[:2]]
    assert job["site_data"] == {k: trained["site_data"][k] for k in ("north", "south")}
    assert job["site_data"]["north"]["positive_class"] == ["malignant"]
