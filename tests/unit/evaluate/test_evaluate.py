"""Batch evaluation and the model registry, end to end on a CheXpert-layout CSV."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score

from fed_auc.cli import main
from fed_auc.data.base import Split
from fed_auc.data.csv_images import load_csv_images
from fed_auc.evaluate.local import evaluate_model
from fed_auc.metrics.report import bootstrap_ci, youden_threshold
from fed_auc.models import build_model
from fed_auc.registry.load import load_registered_model
from fed_auc.registry.register import register_model
from fed_auc.tta import predict
from tests.support.data_files import FINDINGS, write_chexpert, write_npz


@pytest.fixture(scope="module")
def chexpert_run(tmp_path_factory):
    """A 5-label model trained 2 rounds on a 3-site CheXpert-layout CSV, exported."""
    root = tmp_path_factory.mktemp("chexpert")
    csv = write_chexpert(root, per_site=30)
    runs = root / "runs"
    args = ["simulate", "--data", f"csv:{csv}", "--sites", "3", "--rounds", "2"]
    args += ["--local-steps", "2", "--batch-size", "8", "--image-size", "16", "--seed", "1"]
    main([*args, "--runs-dir", str(runs), "--register", "chex-tiny", "--models-dir", str(root)])
    (model_dir,) = runs.glob("*/model")
    return csv, model_dir


def test_chexpert_csv_trains_and_evaluates_per_site_per_label(chexpert_run, tmp_path):
    csv, model_dir = chexpert_run
    out = tmp_path / "eval"
    manifest_file = model_dir.parent / "partition.json"  # exactly the run's sites and splits
    main(
        ["evaluate", "--model", str(model_dir), "--data", f"csv:{csv}", "--by-site"]
        + ["--manifest", str(manifest_file), "--bootstrap", "200", "--out", str(out)]
    )
    results = json.loads((out / "evaluation.json").read_text())
    assert set(results["sites"]) == {"a", "b", "c", "pooled"}
    assert results["label_names"] == FINDINGS
    table = pd.read_csv(out / "evaluation.csv")
    assert len(table) == 4 * 5
    assert (out / "roc.png").stat().st_size > 1000

    # recompute site a's numbers independently from the model file and the CSV
    model, card = load_registered_model(model_dir / "model.pt")
    pool = load_csv_images(csv, image_size=16)
    manifest = json.loads(manifest_file.read_text())
    rows = manifest["sites"]["a"]["test"]
    labels, scores = pool.labels[rows].numpy(), predict(model, pool.images[rows], card["tta"])
    for j, finding in enumerate(FINDINGS):
        r = results["sites"]["a"][finding]
        known = ~np.isnan(labels[:, j])
        y = labels[known, j]
        assert r["n"] == known.sum() and r["positives"] == y.sum()
        if 0 < y.sum() < len(y):
            assert r["auc"] == pytest.approx(roc_auc_score(y, scores[known, j]))
            assert r["ci_lo"] <= r["auc"] <= r["ci_hi"]
            assert r["prevalence"] == pytest.approx(y.mean())
        else:
            assert r["auc"] is None and r["note"].startswith("AUC undefined: no ")
    defined = {s: v[FINDINGS[0]]["auc"] for s, v in results["sites"].items() if s != "pooled"}
    defined = {s: a for s, a in defined.items() if a is not None}
    assert results["worst_site_auc"][FINDINGS[0]]["auc"] == min(defined.values())


def test_evaluate_refuses_anything_but_the_registry_format(chexpert_run, tmp_path):
    csv, _ = chexpert_run
    plain = tmp_path / "plain.pt"
    torch.save(build_model("tiny").state_dict(), plain)
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    for path, reason in ((plain, "format None"), (text, "not a fed-auc-model/1 file")):
        with pytest.raises(SystemExit, match=reason) as exc:
            main(["evaluate", "--model", str(path), "--data", f"csv:{csv}", "--out", str(tmp_path)])
        assert "fed-auc-model/1" in str(exc.value)


def test_registered_model_is_a_copy_and_names_are_checked(chexpert_run, tmp_path):
    _, model_dir = chexpert_run
    registered = model_dir.parents[2] / "chex-tiny"
    card = json.loads((registered / "model_card.json").read_text())
    assert card["label_names"] == FINDINGS and len(card["data_cards"]) == 3
    assert card["selected_round"] in (1, 2) and len(card["threshold"]) == 5
    target = register_model(model_dir, "again", tmp_path)
    assert (target / "model.pt").read_bytes() == (model_dir / "model.pt").read_bytes()
    with pytest.raises(ValueError, match="already exists"):
        register_model(model_dir, "again", tmp_path)
    with pytest.raises(ValueError, match="model name = '../x'"):
        register_model(model_dir, "../x", tmp_path)


def test_a_site_with_one_class_gets_an_explicit_undefined_auc():
    model = build_model("tiny", num_labels=1).eval()
    images = torch.rand(12, 1, 16, 16)
    sites = {
        "both": Split(images, torch.tensor([[1.0], [0.0]] * 6)),
        "negatives": Split(images, torch.zeros(12, 1)),
    }
    results = evaluate_model(model, {"label_names": ["x"]}, sites, n_boot=50)
    row = results["sites"]["negatives"]["x"]
    assert row["auc"] is None and row["note"] == "AUC undefined: no positives"
    assert row["sensitivity"] is None and 0 <= row["specificity"] <= 1
    assert results["worst_site_auc"]["x"]["site"] == "both"
    assert results["sites"]["pooled"]["x"]["n"] == 24


def test_bootstrap_ci_narrows_with_more_data_and_youden_separates():
    rng = np.random.default_rng(0)

    def ci_width(n: int) -> float:
        y = rng.random(n) < 0.3
        s = rng.normal(y.astype(float), 1.0)
        lo, hi = bootstrap_ci(y.astype(int), s, 300, seed=1)
        return hi - lo

    assert ci_width(1000) < 0.5 * ci_width(60)
    labels = np.array([0, 0, 0, 1, 1, 1], dtype=float)
    scores = np.array([0.1, 0.2, 0.3, 0.6, 0.7, 0.9])
    assert 0.3 < youden_threshold(labels, scores) <= 0.6
    assert youden_threshold(np.zeros(4), scores[:4]) == 0.5


def test_roc_points_and_operating_point_match_the_scores():
    model = build_model("tiny", num_labels=1).eval()
    images = torch.rand(40, 1, 16, 16)
    labels = torch.tensor([[1.0], [0.0], [0.0], [0.0]] * 10)
    scores = predict(model, images)[:, 0]
    card = {"label_names": ["x"], "threshold": [float(np.median(scores))]}
    r = evaluate_model(model, card, {"s": Split(images, labels)}, n_boot=0)["sites"]["s"]["x"]
    y = labels[:, 0].numpy() == 1
    assert r["sensitivity"] == pytest.approx((scores[y] >= card["threshold"][0]).mean())
    assert r["specificity"] == pytest.approx((scores[~y] < card["threshold"][0]).mean())
    assert r["roc"]["fpr"][0] == 0 and r["roc"]["tpr"][-1] == 1
    assert np.trapezoid(r["roc"]["tpr"], r["roc"]["fpr"]) == pytest.approx(r["auc"])
    assert r["ci_lo"] is None  # no bootstrap asked for
    called = scores >= card["threshold"][0]
    assert r["ppv"] == pytest.approx(y[called].mean()) and r["npv"] == pytest.approx(
        (~y[~called]).mean()
    )
    assert r["brier"] == pytest.approx(np.mean((scores - y) ** 2), abs=1e-6)
    cut = r["threshold_at_spec_90"]
    assert (scores[~y] < cut).mean() >= 0.9
    assert r["sensitivity_at_spec_90"] == pytest.approx((scores[y] >= cut).mean())
    assert sum(r["bins"]["positives"]) == y.sum() and sum(r["bins"]["negatives"]) == (~y).sum()


def test_without_by_site_all_rows_are_one_site_and_label_mismatch_is_named(chexpert_run, tmp_path):
    csv, model_dir = chexpert_run
    main(
        ["evaluate", "--model", str(model_dir), "--data", f"csv:{csv}", "--bootstrap", "20"]
        + ["--split", "val", "--out", str(tmp_path / "all")]
    )
    results = json.loads((tmp_path / "all" / "evaluation.json").read_text())
    assert list(results["sites"]) == ["all"] and results["split"] == "val"
    with pytest.raises(SystemExit, match=r"cannot read manifest .*nope\.json"):
        main(
            ["evaluate", "--model", str(model_dir), "--data", f"csv:{csv}"]
            + ["--manifest", str(tmp_path / "nope.json"), "--out", str(tmp_path / "x")]
        )
    npz = write_npz(tmp_path / "m.npz")
    with pytest.raises(SystemExit, match=r"data has 1 label\(s\), the model 5"):
        main(
            ["evaluate", "--model", str(model_dir), "--data", f"medmnist:{npz}"]
            + ["--out", str(tmp_path / "x")]
        )
