"""Image paths stay inside the data root (fed_auc.data.paths), played as the author of a CSV
the node reads: each way out of the root (``..``, an absolute path, a symlinked file, a
symlinked folder) names an image every local user's files could be, and the node refuses it
by CSV, line and path, at load and at ``fed-auc node --check``, unless the site file allows
it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fed_auc.cli import main
from fed_auc.data.csv_images import load_csv_images
from fed_auc.site import SiteDefinition
from tests.support.data_files import write_png

SIZE = 8


def _layout(tmp_path: Path, escape: str) -> tuple[Path, str]:
    """A data folder of 12 PNGs and, outside it, a PNG the CSV's row 3 reaches by ``escape``;
    the CSV and that row's path as written."""
    data, secret = tmp_path / "data", tmp_path / "elsewhere" / "other_patient.png"
    for i in range(12):
        write_png(data / "img" / f"{i}.png", 60 + 10 * i, seed=i)
    write_png(secret, 200, seed=99)
    named = {
        "dot-dot": "../elsewhere/other_patient.png",
        "absolute": str(secret),
        "symlinked file": "img/link.png",
        "symlinked folder": "linked/other_patient.png",
        "'..' after a symlink": "deep/../other_patient.png",  # lexically data/other_patient.png
    }[escape]
    if escape == "symlinked file":
        os.symlink(secret, data / "img" / "link.png")
    elif escape == "symlinked folder":
        os.symlink(secret.parent, data / "linked")
    elif escape == "'..' after a symlink":
        (secret.parent / "sub").mkdir()
        os.symlink(secret.parent / "sub", data / "deep")
    rows = [f"img/{i}.png,{i % 2},p{i}" for i in range(12)]
    rows[1] = f"{named},1,p1"  # CSV line 3
    csv = data / "labels.csv"
    csv.write_text("Path,label,patient_id\n" + "\n".join(rows) + "\n")
    return csv, named


ESCAPES = ["dot-dot", "absolute", "symlinked file", "symlinked folder", "'..' after a symlink"]


@pytest.mark.parametrize("escape", ESCAPES)
def test_an_image_path_leading_outside_the_data_root_is_refused_by_name(tmp_path, escape):
    csv, named = _layout(tmp_path, escape)
    with pytest.raises(ValueError) as refused:
        load_csv_images(csv, image_size=SIZE)
    message = str(refused.value)
    assert f"{csv} line 3: image path {named!r}" in message
    assert f"outside the data root {tmp_path.resolve() / 'data'}" in message
    assert "images_outside_root = true" in message


@pytest.mark.parametrize("escape", ESCAPES)
def test_node_check_reports_the_escaping_row_and_the_site_file_can_allow_it(
    tmp_path, escape, capsys
):
    csv, named = _layout(tmp_path, escape)
    site = tmp_path / "north.toml"
    site.write_text(f'name = "north"\n[data]\nspec = "csv:{csv}"\n[node]\nstate_dir = "state"\n')
    with pytest.raises(SystemExit, match=rf"line 3: image path '{named}' leads to .*outside"):
        main(["node", "--site", str(site), "--check", "--image-size", str(SIZE)])
    assert not (tmp_path / "state" / "image_cache").exists()  # nothing of it was read
    allowed = site.read_text().replace("[node]", "images_outside_root = true\n[node]")
    site.write_text(allowed)
    assert len(SiteDefinition.from_toml(site).load(SIZE).train) > 0


def test_paths_inside_the_root_load_through_symlinks_that_stay_inside(tmp_path):
    data = tmp_path / "real"
    for i in range(12):
        write_png(data / "img" / f"{i}.png", 60 + 10 * i, seed=i)
    os.symlink(data / "img" / "0.png", data / "img" / "alias.png")  # inside, to inside
    rows = [f"img/{i}.png,{i % 2}" for i in range(12)] + ["img/sub/../alias.png,0"]
    (data / "img" / "sub").mkdir()
    (data / "labels.csv").write_text("Path,label\n" + "\n".join(rows) + "\n")
    os.symlink(data, tmp_path / "root-link")  # the data root itself reached by a symlink
    pool = load_csv_images(tmp_path / "root-link" / "labels.csv", image_size=SIZE)
    assert len(pool.labels) == 13


def test_the_site_file_setting_must_be_true_or_false(tmp_path):
    site = tmp_path / "north.toml"
    site.write_text(
        'name = "north"\n[data]\nspec = "csv:labels.csv"\nimages_outside_root = "yes"\n'
    )
    with pytest.raises(ValueError, match=r"images_outside_root = 'yes': must be true or false"):
        SiteDefinition.from_toml(site)
