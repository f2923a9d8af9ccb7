"""hospitals/examples/split_medmnist.py: one MedMNIST npz into N site npz files + site TOMLs."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from fed_auc.site import SiteDefinition, check_site_data
from tests.support.data_files import write_npz
from tests.support.paths import ROOT

SCRIPT = ROOT / "hospitals" / "examples" / "split_medmnist.py"
SPLITS = ("train", "val", "test")


def _script():
    spec = importlib.util.spec_from_file_location("split_medmnist", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("skew", [[], ["--dirichlet", "0.5"]], ids=["stratified", "dirichlet"])
def test_sites_partition_every_split_exactly_and_load_as_site_files(tmp_path, skew, capsys):
    source = write_npz(tmp_path / "m.npz", n=(60, 20, 30))
    out = tmp_path / "sites"
    assert _script().main([str(source), "--out", str(out), "--sites", "3", *skew]) == 0
    raw = dict(np.load(source))
    manifest = json.loads((out / "split.json").read_text())
    assert list(manifest["sites"]) == ["north", "south", "east"]
    for split in SPLITS:
        rows = np.concatenate([np.array(m[split], int) for m in manifest["sites"].values()])
        assert sorted(rows.tolist()) == list(range(len(raw[f"{split}_labels"])))  # a partition
    for index, (name, rows) in enumerate(manifest["sites"].items()):
        part = np.load(out / f"{name}.npz")
        for split in SPLITS:
            for kind in ("images", "labels"):
                expected = raw[f"{split}_{kind}"][rows[split]]
                assert part[f"{split}_{kind}"].dtype == expected.dtype
                np.testing.assert_array_equal(part[f"{split}_{kind}"], expected)
        site = SiteDefinition.from_toml(out / f"{name}.toml")
        assert (site.name, site.index) == (name, index)
        assert site.state_dir == (out / "nodes" / name).resolve()
        assert site.data["spec"] == f"medmnist:{(out / f'{name}.npz').resolve()}"
        data = site.load(image_size=16)
        assert [len(getattr(data, s)) for s in SPLITS] == [len(rows[s]) for s in SPLITS]
        check_site_data(site, data)  # every val/test split has both classes
    if not skew:  # stratified: each class of each split shared out within one image
        for split in SPLITS:
            labels = raw[f"{split}_labels"][:, 0]
            for cls in (0, 1):
                counts = [int((labels[m[split]] == cls).sum()) for m in manifest["sites"].values()]
                assert max(counts) - min(counts) <= 1, (split, cls, counts)
    assert "wrote 3 sites" in capsys.readouterr().out


def test_refuses_to_overwrite_and_bad_names(tmp_path):
    source = write_npz(tmp_path / "m.npz")
    script = _script()
    script.main([str(source), "--out", str(tmp_path), "--names", "a,b"])
    with pytest.raises(SystemExit, match="exists: use --force"):
        script.main([str(source), "--out", str(tmp_path), "--names", "a,b"])
    assert script.main([str(source), "--out", str(tmp_path), "--names", "a,b", "--force"]) == 0
    with pytest.raises(SystemExit):
        script.main([str(source), "--out", str(tmp_path), "--names", "a,a"])
