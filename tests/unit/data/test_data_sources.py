"""MedMNIST npz and CSV + image sources: what they read, and the errors on bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fed_auc.cli import main
from fed_auc.data.cards import data_card
from fed_auc.data.csv_images import load_csv_images
from fed_auc.data.images import read_image
from fed_auc.data.medmnist import load_medmnist
from fed_auc.data.partition import partition_pool
from fed_auc.data.reading import DataReading
from fed_auc.data.spec import parse_data_spec
from tests.support.data_files import FINDINGS, write_chexpert, write_dicom, write_npz


def test_medmnist_reads_every_split_scaled_and_resized(tmp_path):
    path = write_npz(tmp_path / "m.npz")
    raw = np.load(path)
    pool = load_medmnist(path, image_size=32)
    assert pool.images.shape == (110, 1, 32, 32) and pool.label_names == ["label"]
    assert list(pool.split).count("val") == 20
    assert pool.labels[:60, 0].tolist() == raw["train_labels"][:, 0].astype(float).tolist()
    native = load_medmnist(path)
    assert native.images[0, 0].numpy() == pytest.approx(raw["train_images"][0] / 255.0)


def test_npz_without_the_expected_keys_names_file_and_keys(tmp_path):
    path = tmp_path / "broken.npz"
    np.savez(path, train_images=np.zeros((2, 8, 8)), train_labels=np.zeros((2, 1)))
    with pytest.raises(ValueError, match=r"broken\.npz: missing key\(s\) \['val_images'"):
        load_medmnist(path)


def test_npz_with_multiclass_labels_names_row_and_value(tmp_path):
    path = write_npz(tmp_path / "m.npz")
    arrays = dict(np.load(path))
    arrays["val_labels"][3, 0] = 4
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match="val_labels row 3 column 0 has value 4"):
        load_medmnist(path)


def test_chexpert_csv_labels_policies_frontal_and_patients(tmp_path):
    csv = write_chexpert(tmp_path)
    zeros = load_csv_images(csv, image_size=16)
    assert zeros.label_names == FINDINGS and len(zeros) == 72
    assert set(zeros.site) == {"a", "b", "c"} and zeros.patient[0] == "patient00000"
    ignore = load_csv_images(csv, image_size=16, reading=DataReading(uncertain="ignore"))
    ones = load_csv_images(csv, image_size=16, reading=DataReading(uncertain="ones"))
    uncertain = torch.isnan(ignore.labels) & ~torch.isnan(zeros.labels)
    assert uncertain.any()
    assert (zeros.labels[uncertain] == 0).all() and (ones.labels[uncertain] == 1).all()
    frontal = load_csv_images(csv, image_size=16, reading=DataReading(frontal_only=True))
    assert len(frontal) == 54  # every fourth row is lateral
    pixel = read_image(tmp_path / "train/patient00000/study1/view1_frontal.png", 16)
    assert pixel.shape == (1, 16, 16) and 0 <= float(pixel.min()) <= float(pixel.max()) <= 1


def test_dicom_images_are_read_normalized_and_monochrome1_inverted(tmp_path):
    pixels = np.arange(256, dtype=np.uint16).reshape(16, 16) * 10
    write_dicom(tmp_path / "x.dcm", pixels)
    write_dicom(tmp_path / "inv.dcm", pixels, photometric="MONOCHROME1")
    image = read_image(tmp_path / "x.dcm", 16)[0].numpy()
    assert image == pytest.approx(pixels / pixels.max())
    assert read_image(tmp_path / "inv.dcm", 16)[0].numpy() == pytest.approx(1 - image)
    (tmp_path / "t.csv").write_text("path,label\nx.dcm,1\ninv.dcm,0\n")
    pool = load_csv_images(tmp_path / "t.csv", image_size=8)
    assert pool.images.shape == (2, 1, 8, 8) and pool.labels[:, 0].tolist() == [1.0, 0.0]


def _csv(tmp_path, body: str):
    from tests.support.data_files import write_png

    for name in ("ok1.png", "ok2.png"):
        write_png(tmp_path / name, 100, seed=1)
    path = tmp_path / "data.csv"
    path.write_text(body)
    return path


def test_missing_image_names_csv_line_and_file(tmp_path):
    path = _csv(tmp_path, "path,label\nok1.png,1\ngone.png,0\n")
    with pytest.raises(ValueError, match=r"data\.csv line 3: image .*gone\.png not found"):
        load_csv_images(path, image_size=8)


def test_corrupt_image_names_csv_line_and_file(tmp_path):
    (tmp_path / "bad.png").write_bytes(b"not a png at all")
    path = _csv(tmp_path, "path,label\nok1.png,1\nbad.png,0\n")
    with pytest.raises(ValueError, match=r"data\.csv line 3: cannot read image .*bad\.png"):
        load_csv_images(path, image_size=8)


def test_label_outside_the_allowed_values_names_line_column_and_value(tmp_path):
    path = _csv(tmp_path, "path,label\nok1.png,1\nok2.png,2\n")
    with pytest.raises(ValueError, match=r"data\.csv line 3, column 'label': label '2' is not"):
        load_csv_images(path, image_size=8)


def test_csv_without_the_needed_columns_says_which(tmp_path):
    path = _csv(tmp_path, "path,finding\nok1.png,1\n")
    with pytest.raises(ValueError, match=r"missing label column\(s\) \['label'\]"):
        load_csv_images(path, image_size=8)
    path.write_text("file,label\nok1.png,1\n")
    with pytest.raises(ValueError, match="no image path column"):
        load_csv_images(path, image_size=8)


def test_a_site_left_empty_is_named(tmp_path):
    rows = "".join(f"ok1.png,{i % 2},a,train\nok2.png,{i % 2},a,test\n" for i in range(6))
    path = _csv(tmp_path, "path,label,site,split\n" + rows + "ok2.png,1,c,test\n")
    pool = load_csv_images(path, image_size=8)
    with pytest.raises(ValueError, match="site 'c' has no training images"):
        partition_pool(pool, "natural", None)


def test_skip_bad_images_warns_and_the_data_card_counts_them(tmp_path):
    (tmp_path / "bad.png").write_bytes(b"\x89PNG broken")
    rows = "".join(f"ok{i % 2 + 1}.png,{i % 2},a\n" for i in range(10))
    path = _csv(tmp_path, "path,label,site\n" + rows + "bad.png,1,a\ngone.png,0,a\n")
    with pytest.warns(UserWarning, match="skipped 2 unreadable image"):
        pool = load_csv_images(path, image_size=8, reading=DataReading(skip_bad_images=True))
    assert len(pool) == 10
    sites, _ = partition_pool(pool, "natural", None)
    assert data_card(sites[0])["skipped_images"] == 2
    out = tmp_path / "cards"
    with pytest.warns(UserWarning):
        main(["data-card", "--data", f"csv:{path}", "--skip-bad-images", "--out", str(out)])
    assert json.loads((out / "a.json").read_text())["skipped_images"] == 2
    assert "Unreadable images skipped: 2" in (out / "a.md").read_text()


def test_data_spec_forms_and_errors():
    assert parse_data_spec("csv:x.csv:/imgs").root.as_posix() == "/imgs"
    assert parse_data_spec("medmnist:a.npz").path.name == "a.npz"
    with pytest.raises(ValueError, match="unknown source 'nifti'"):
        parse_data_spec("nifti:x")
    with pytest.raises(ValueError, match="needs a path"):
        parse_data_spec("csv")


def test_a_site_toml_data_table_loads_that_sites_rows(tmp_path):
    from fed_auc.data.spec import site_from_config

    csv = write_chexpert(tmp_path)
    site = site_from_config("north", {"spec": f"csv:{csv}", "site": "b"}, image_size=16)
    assert site.name == "north" and site.label_names == FINDINGS
    assert len(site.train) + len(site.val) + len(site.test) == 24
    assert site.meta["patients"] == 12
    assert site.meta["splits"] == "seeded 70/10/20 by patient (split_seed 0)"
    card = data_card(site)  # a site file's own rows: no partitioner in its card
    assert "partition" not in card["details"] and "partitioner" not in str(card["limits"])
    with pytest.raises(ValueError, match="no rows with site 'z'"):
        site_from_config("x", {"spec": f"csv:{csv}", "site": "z"}, image_size=16)
    with pytest.raises(ValueError, match=r"unknown \['path'\]"):
        site_from_config("x", {"spec": f"csv:{csv}", "path": "y"}, image_size=16)
