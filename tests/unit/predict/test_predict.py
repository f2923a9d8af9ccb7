"""``fed-auc predict`` scores as ``fed-auc evaluate`` does, decides at the card's threshold,
names what it could not read and goes on, and records counts (never identifiers) in the store
where the dashboard lists them."""

from __future__ import annotations

import csv

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from app import predictions_data
from fed_auc.cli import main
from fed_auc.data.base import Split
from fed_auc.data.cache import file_sha256
from fed_auc.data.csv_images import load_csv_images
from fed_auc.evaluate.local import score_sites
from fed_auc.node.compute import Compute
from fed_auc.predict.job import NO_CALIBRATION
from fed_auc.registry.load import load_registered_model
from fed_auc.store.run_store import RunStore
from tests.support.data_files import write_dicom, write_png, write_png16
from tests.support.predict_files import tiny_model, write_study_dicom

GOOD = ["a/one.png", "a/wide.png", "b/deep.png", "c/plain.dcm", "c/study.dcm"]


@pytest.fixture
def images(tmp_path):
    """Five readable images of every kind read_image reads (8-bit, non-square, 16-bit PNG,
    DICOM with and without study attributes), a corrupt PNG and a text file."""
    root = tmp_path / "images"
    write_png(root / GOOD[0], 120, seed=1)
    root.joinpath("a").mkdir(exist_ok=True)
    rng = np.random.default_rng(2)
    Image.fromarray(rng.integers(0, 255, (12, 20)).astype(np.uint8)).save(root / GOOD[1])
    write_png16(root / GOOD[2], rng.integers(0, 4000, (16, 16)))
    write_dicom(root / GOOD[3], rng.integers(0, 1000, (16, 16)), window=(500, 800))
    write_study_dicom(root / GOOD[4], "1.2.3.4", "P1", seed=3)
    (root / "a" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    (root / "notes.txt").write_text("not an image")
    return root


def _evaluate_scores(tmp_path, images, model_dir) -> np.ndarray:
    """The scores ``fed-auc evaluate``'s path gives the GOOD images: the CSV reader at the
    card's size, ``score_sites`` with the card's TTA."""
    table = tmp_path / "eval.csv"
    table.write_text("Path,label\n" + "".join(f"images/{p},0\n" for p in GOOD))
    model, card = load_registered_model(model_dir)
    pool = load_csv_images(table, image_size=card["image_size"])
    split = Split(pool.images, pool.labels)
    return score_sites(model, {"s": split}, card["tta"], Compute(torch.device("cpu")))["s"][1]


def _predict(args: list[str]) -> tuple[int, pd.DataFrame]:
    code = main(["predict", *args])
    out = args[args.index("--out") + 1]
    return code, pd.read_csv(out, dtype=str, keep_default_na=False)


def test_scores_equal_evaluate_decisions_follow_the_threshold_and_a_bad_file_is_named(
    tmp_path, images, capsys
):
    expected = _evaluate_scores(tmp_path, images, tiny_model(tmp_path / "m0"))[:, 0]
    threshold = float(np.median(expected))  # both decisions occur
    model_dir = tiny_model(tmp_path / "model", threshold=[threshold])
    runs, out = tmp_path / "runs", tmp_path / "pred.csv"
    code, table = _predict(["--model", str(model_dir), "--images", str(images), "--out",
                            str(out), "--store", str(runs)])  # fmt: skip
    assert code == 3  # the job ran; one image could not be read
    rows = table.set_index("path")
    assert len(rows) == len(GOOD) + 1  # the text file is not an image
    scores = np.array([float(rows.loc[str(images / p), "finding_score"]) for p in GOOD])
    np.testing.assert_allclose(scores, expected, atol=1e-6, rtol=0)
    decisions = [rows.loc[str(images / p), "finding_decision"] for p in GOOD]
    assert decisions == ["positive" if s >= threshold else "negative" for s in scores]
    assert set(decisions) == {"positive", "negative"}
    good = rows.loc[[str(images / p) for p in GOOD]]
    assert (good["finding_threshold"].astype(float) == threshold).all()
    assert (good["finding_positive_class"] == "finding present").all()
    assert (good["model_run_id"] == "run-tiny").all()
    assert (good["model_sha256"] == file_sha256(model_dir / "model.pt")).all()
    assert (good["finding_probability"] == "").all() and (good["error"] == "").all()
    assert rows.loc[str(images / GOOD[4]), "StudyInstanceUID"] == "1.2.3.4"
    assert rows.loc[str(images / GOOD[4]), "PatientID"] == "P1"
    broken = rows.loc[str(images / "a" / "broken.png")]
    assert broken["finding_score"] == "" and str(images / "a" / "broken.png") in broken["error"]
    printed = capsys.readouterr()
    failed = [line for line in printed.err.splitlines() if "not scored: " in line]
    assert len(failed) == 1 and f"cannot read image {images / 'a' / 'broken.png'}: " in failed[0]
    assert "1 file(s) under" in printed.err  # the text file, named once
    assert NO_CALIBRATION in printed.out

    with RunStore(runs) as store:
        (job,) = store.predictions().to_dict("records")
    assert (job["n_images"], job["n_failed"], job["sr_count"]) == (6, 1, 0)
    assert job["positives"] == f"[{decisions.count('positive')}]"
    assert job["model_sha256"] == file_sha256(model_dir / "model.pt")
    assert job["output"] == str(out.resolve()) and job["input"] == f"folder {images.resolve()}"
    recorded = " ".join(str(v) for v in job.values())
    assert not any(s in recorded for s in ("1.2.3.4", "P1", "one.png", "broken.png"))
    listed = predictions_data.prediction_jobs(runs, "run-tiny")
    assert listed["id"].tolist() == [job["id"]]
    assert predictions_data.prediction_jobs(runs, "another-run").empty


def test_a_csv_input_scores_as_the_folder_and_calibration_fills_the_probability(
    tmp_path, images, capsys
):
    calibration = [
        {
            "label": "label",
            "method": "isotonic",
            "x": [0.0, 0.4, 0.6, 1.0],
            "y": [0.0, 0.1, 0.7, 1.0],
        }
    ]
    model_dir = tiny_model(tmp_path / "model", calibration=calibration)
    table = images / "list.csv"
    with table.open("w", newline="") as f:
        csv.writer(f).writerows([["image", "site"], *[[p, "x"] for p in GOOD]])
    code, rows = _predict(["--model", str(model_dir), "--csv", str(table), "--out",
                           str(tmp_path / "p.csv"), "--store", str(tmp_path / "runs")])  # fmt: skip
    assert code == 0 and NO_CALIBRATION not in capsys.readouterr().out
    expected = _evaluate_scores(tmp_path, images, model_dir)[:, 0]
    np.testing.assert_allclose(rows["finding_score"].astype(float), expected, atol=1e-6)
    knots = calibration[0]
    probability = np.interp(rows["finding_score"].astype(float), knots["x"], knots["y"])
    np.testing.assert_allclose(rows["finding_probability"].astype(float), probability, atol=1e-12)


def test_two_labels_have_their_own_columns_and_thresholds(tmp_path, images):
    model_dir = tiny_model(tmp_path / "model", labels=("a", "b"), threshold=[0.0, 1.0])
    code, rows = _predict(["--model", str(model_dir), "--images", str(images / "a"), "--out",
                           str(tmp_path / "p.csv"), "--store", str(tmp_path / "runs")])  # fmt: skip
    good = rows[rows["error"] == ""]
    assert code == 3 and len(good) == 2
    assert (good["a_decision"] == "positive").all() and (good["b_decision"] == "negative").all()
    assert (good["b_positive_class"] == "b present").all()


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing model", "--model {tmp}/nowhere: no such file or folder"),
        ("no model.pt", "no model.pt found"),
        ("empty folder", "no image files (.png, .jpg, .jpeg, .dcm) in it or below"),
        ("no path column", "no image path column; expected one of ['Path', 'path', 'image']"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, images, case, message):
    model_dir = tiny_model(tmp_path / "model")
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.csv").write_text("file,label\nx.png,1\n")
    args = {
        "missing model": ["--model", str(tmp_path / "nowhere"), "--images", str(tmp_path)],
        "no model.pt": ["--model", str(tmp_path / "empty"), "--images", str(images)],
        "empty folder": ["--model", str(model_dir), "--images", str(tmp_path / "empty")],
        "no path column": ["--model", str(model_dir), "--csv", str(tmp_path / "bad.csv")],
    }[case]
    out = tmp_path / "p.csv"
    with pytest.raises(SystemExit) as exc:
        main(["predict", *args, "--out", str(out), "--store", str(tmp_path / "runs")])
    text = str(exc.value.code)
    assert text.startswith("fed-auc predict: ") and "\n" not in text
    assert message.format(tmp=tmp_path) in text
    assert not out.exists()
