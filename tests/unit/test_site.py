"""Site files (fed_auc.site): each kind of data loads, `fed-auc node --check` and the start
check refuse bad data with the file, line and value, `fed-auc simulate --site` runs exactly
the sites given, and memory budgets resolve."""

from __future__ import annotations

import builtins
import csv
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fed_auc.algorithms.partial import MemoryBudget, parse_budget
from fed_auc.cli import main
from fed_auc.cli.federation import require_flower
from fed_auc.data.memmap import gather
from fed_auc.site import SiteDefinition, available_memory, check_site_data
from tests.support.data_files import write_dicom, write_npz, write_png

SIZE = 16  # image side of every file written here, and of the loads


def _site_file(folder: Path, name: str, data: dict, node: dict | None = None) -> Path:
    """A site TOML with a [data] table (and a [node] table: its state under the folder)."""
    node = {"state_dir": f"state/{name}", **(node or {})}
    lines = [f"name = {json.dumps(name)}", "", "[data]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in data.items()]
    lines += ["", "[node]", *[f"{k} = {json.dumps(v)}" for k, v in node.items()]]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _write_csv(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _png_rows(
    root: Path, site: str, patients: int, value: float, split: bool = False, seed: int = 0
) -> list[dict]:
    """Two identical PNGs per patient (the first of every three patients positive) under
    ``root``; with ``split``, patients go to train/val/test by a fixed pattern that gives
    every split both classes."""
    rows = []
    for p in range(patients):
        label = "1" if p % 3 == 0 else "0"
        for view in (1, 2):
            rel = f"img/{site}/p{p:03d}_{view}.png"
            write_png(root / rel, value + (60 if label == "1" else 0), seed=seed * 1000 + p)
            row = {"Path": rel, "label": label, "patient_id": f"{site}{p}", "site": site}
            if split:
                row["split"] = ("train", "train", "val", "test")[p % 4] if p >= 6 else (
                    "val", "test", "val", "test", "train", "train",
                )[p]  # fmt: skip
            rows.append(row)
    return rows


def _shared_csv(root: Path, split: bool = False) -> Path:
    """One CSV for two hospitals: site a (dark images) and site b (bright images)."""
    rows = _png_rows(root, "a", 18, 40, split) + _png_rows(root, "b", 12, 140, split, seed=1)
    return _write_csv(root / "all.csv", rows)


def _images(split) -> set[bytes]:
    return {image.numpy().tobytes() for image in gather(split.images)}


# -- (a) each kind of site file loads ----------------------------------------------------------
def test_an_npz_site_loads_its_file_splits_with_paths_from_the_site_files_folder(
    tmp_path, monkeypatch
):
    (tmp_path / "sites" / "data").mkdir(parents=True)
    write_npz(tmp_path / "sites" / "data" / "north.npz", n=(30, 10, 12))
    path = _site_file(tmp_path / "sites", "north", {"spec": "medmnist:data/north.npz"})
    monkeypatch.chdir(tmp_path)  # not the site file's folder
    site = SiteDefinition.from_toml(path)
    assert site.data["spec"] == f"medmnist:{(tmp_path / 'sites/data/north.npz').resolve()}"
    assert site.state_dir == (tmp_path / "sites" / "state" / "north").resolve()
    data = site.load(SIZE)
    assert data.name == "north" and data.meta["site_file"] == str(path)
    assert [len(data.train), len(data.val), len(data.test)] == [30, 10, 12]  # the file's
    assert tuple(data.train.images.shape[1:]) == (1, SIZE, SIZE)
    check_site_data(site, data)  # both classes in every split (write_npz makes sure)


def test_a_site_column_picks_the_sites_rows_of_a_shared_csv(tmp_path):
    shared = _shared_csv(tmp_path / "shared")
    sites = tmp_path / "sites"
    spec = {"spec": "csv:../shared/all.csv"}
    a = SiteDefinition.from_toml(_site_file(sites, "a", {**spec, "site": "a"})).load(SIZE)
    b = SiteDefinition.from_toml(_site_file(sites, "b", {**spec, "site": "b"})).load(SIZE)
    assert sum(map(len, (a.train, a.val, a.test))) == 36  # 18 patients × 2 views
    assert sum(map(len, (b.train, b.val, b.test))) == 24
    # a's images are the dark ones, b's the bright ones: the rows come from the right site
    assert gather(a.train.images).mean() < 0.35 < gather(b.train.images).mean()
    assert (a.name, b.name) == ("a", "b") and a.label_names == ["label"]
    # no split column: 70/10/20 by patient, so no patient's image is in two splits
    train, val, test = _images(a.train), _images(a.val), _images(a.test)
    assert not (train & test or train & val or val & test)
    assert len(test) == 4 and len(val) == 2  # 20 % and 10 % of 18 patients (rounded)

    # csv:PATH:ROOT: image paths start at ROOT, relative to the site file as well
    _write_csv(tmp_path / "lists" / "a.csv", _png_rows(shared.parent, "a", 18, 40))
    rooted = _site_file(sites, "rooted", {"spec": "csv:../lists/a.csv:../shared"})
    again = SiteDefinition.from_toml(rooted).load(SIZE)
    assert torch.equal(gather(again.train.images), gather(a.train.images))


def test_a_site_of_a_shared_csv_reads_only_its_own_rows(tmp_path):
    """Another hospital's missing image or bad label does not stop this site's node."""
    root = tmp_path / "shared"
    shared = _shared_csv(root, split=True)
    lines = shared.read_text().splitlines()
    b_row = next(i for i, line in enumerate(lines) if line.endswith(",b,test"))
    lines[b_row] = lines[b_row].replace(",0,", ",2,").replace(",1,", ",2,")  # bad label in b
    shared.write_text("\n".join(lines) + "\n")
    (root / "img" / "b" / "p000_1.png").unlink()  # and a missing image
    a = _site_file(tmp_path, "a", {"spec": "csv:shared/all.csv", "site": "a"})
    site = SiteDefinition.from_toml(a)
    data = site.load(SIZE)
    check_site_data(site, data)
    assert [len(data.train), len(data.val), len(data.test)] == [16, 10, 10]
    b = _site_file(tmp_path, "b", {"spec": "csv:shared/all.csv", "site": "b"})
    with pytest.raises(ValueError, match=r"all.csv line \d+, column 'label': label '2'"):
        SiteDefinition.from_toml(b).load(SIZE)


def test_a_dicom_csv_site_loads_with_its_split_column(tmp_path):
    rows = []
    rng = np.random.default_rng(0)
    for i in range(20):
        label = i % 2
        pixels = rng.integers(0, 1000, (SIZE, SIZE)) + 3000 * label * np.eye(SIZE, dtype=int)
        rel = f"dicom/image{i:02d}.dcm"
        write_dicom(tmp_path / "data" / rel, pixels, "MONOCHROME1" if i == 3 else "MONOCHROME2")
        split = "train" if i < 12 else "val" if i < 16 else "test"
        rows.append({"path": rel, "label": str(label), "split": split})
    _write_csv(tmp_path / "data" / "images.csv", rows)
    path = _site_file(tmp_path, "dicom_site", {"spec": "csv:data/images.csv"})
    site = SiteDefinition.from_toml(path)
    data = site.load(SIZE)
    expected = [sum(r["split"] == s for r in rows) for s in ("train", "val", "test")]
    assert [len(data.train), len(data.val), len(data.test)] == expected == [12, 4, 4]
    pixels = gather(data.train.images)
    assert float(pixels.min()) >= 0 and float(pixels.max()) <= 1
    check_site_data(site, data)


def test_the_split_column_decides_the_split_whatever_the_split_seed(tmp_path):
    _shared_csv(tmp_path / "shared", split=True)
    sites = tmp_path / "sites"
    loads = [
        SiteDefinition.from_toml(
            _site_file(
                sites,
                f"a{seed}",
                {"spec": "csv:../shared/all.csv", "site": "a", "split_seed": seed},
            )  # fmt: skip
        ).load(SIZE)
        for seed in (0, 9)
    ]
    # 18 patients by the pattern: 6 fixed (2 train, 2 val, 2 test), 12 by p % 4
    assert [len(loads[0].train), len(loads[0].val), len(loads[0].test)] == [16, 10, 10]
    for split in ("train", "val", "test"):
        assert torch.equal(
            gather(getattr(loads[0], split).images), gather(getattr(loads[1], split).images)
        )


def test_without_a_split_column_split_seed_seeds_the_split_and_the_experiment_seed_does_not(
    tmp_path,
):
    _shared_csv(tmp_path / "shared")
    sites = tmp_path / "sites"

    def load(seed: int, experiment_seed: int = 0):
        data = {"spec": "csv:../shared/all.csv", "site": "a", "split_seed": seed}
        return SiteDefinition.from_toml(_site_file(sites, "a", data)).load(
            SIZE, seed=experiment_seed
        )

    first, again, other = load(3), load(3), load(4)
    for split in ("train", "val", "test"):
        assert torch.equal(
            gather(getattr(first, split).images), gather(getattr(again, split).images)
        )
    assert _images(first.test) != _images(other.test)  # another split_seed, another split
    for experiment_seed in (1, 7):  # the test images never change between experiments
        assert torch.equal(gather(load(3, experiment_seed).test.images), gather(first.test.images))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"spec": "synthetic"}, "[data] spec = 'synthetic': use a [synthetic] table instead"),
        ({"spec": "pacs:x"}, "[data] data spec 'pacs:x': unknown source 'pacs'"),
        ({}, "[data] needs spec = 'medmnist:PATH', 'csv:PATH[:ROOT]' or 'dicomweb:LABELS.csv'"),
        ({"spec": "csv:x.csv", "uncertain": "maybe"}, "[data] uncertain = 'maybe'"),
        ({"spec": "csv:x.csv", "split_seed": -1}, "[data] split_seed = -1"),
        ({"spec": "csv:x.csv", "frontal_only": "yes"}, "[data] frontal_only = 'yes'"),
        ({"spec": "csv:x.csv", "folds": 5}, "unknown [data] key(s) ['folds']"),
    ],
)
def test_data_table_errors_name_the_file_and_field(tmp_path, data, message):
    with pytest.raises(ValueError, match="bad.toml") as error:
        SiteDefinition.from_toml(_site_file(tmp_path, "bad", data))
    assert message in str(error.value)


def test_a_file_site_needs_a_valid_name(tmp_path):
    path = _site_file(tmp_path, "x", {"spec": "csv:x.csv"})
    path.write_text(path.read_text().replace('name = "x"', 'name = "-x y"'))
    with pytest.raises(ValueError, match=r"x.toml: name = '-x y': letters, digits"):
        SiteDefinition.from_toml(path)
    path.write_text(path.read_text().replace('name = "-x y"\n', ""))
    with pytest.raises(ValueError, match="x.toml: missing required top-level field 'name'"):
        SiteDefinition.from_toml(path)


# -- (b) fed-auc node --check ------------------------------------------------------------------
def _node(path: Path, *extra: str) -> int:
    return main(["node", "--site", str(path), "--image-size", str(SIZE), *extra])


def _check_fails(path: Path, *needles: str) -> str:
    with pytest.raises(SystemExit) as error:
        _node(path, "--check")
    message = str(error.value.code)
    assert message.startswith("fed-auc node: ") and str(path) in message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


def test_check_prints_the_data_card_of_each_kind_of_site(tmp_path, capsys):
    write_npz(tmp_path / "north.npz", n=(30, 10, 12))
    npz = _site_file(tmp_path, "north", {"spec": "medmnist:north.npz"})
    _shared_csv(tmp_path / "shared", split=True)
    png = _site_file(tmp_path, "a", {"spec": "csv:shared/all.csv", "site": "a"})
    for path, name, train in ((npz, "north", 30), (png, "a", 16)):
        assert _node(path, "--check") == 0
        out = capsys.readouterr().out
        assert f"# Data card — {name}" in out and "| test |" in out
        assert f"fed-auc node --check: {path} is ready ({train} training images)" in out


def test_check_names_the_csv_line_of_a_missing_image(tmp_path):
    root = tmp_path / "shared"
    _shared_csv(root, split=True)
    (root / "img" / "a" / "p002_2.png").unlink()  # row 6 of the CSV: line 7 with the header
    path = _site_file(tmp_path, "a", {"spec": "csv:shared/all.csv", "site": "a"})
    _check_fails(path, f"{root / 'all.csv'} line 7", "p002_2.png", "not found")


def test_check_names_the_csv_line_column_and_value_of_a_bad_label(tmp_path):
    root = tmp_path / "shared"
    rows = _png_rows(root, "a", 12, 40, split=True)
    rows[4]["label"] = "2"  # line 6
    _write_csv(root / "a.csv", rows)
    path = _site_file(tmp_path, "a", {"spec": "csv:shared/a.csv"})
    _check_fails(path, "a.csv line 6, column 'label': label '2' is not one of 1, 0, -1 or blank")
    rows[4]["label"] = "yes"
    _write_csv(root / "a.csv", rows)
    _check_fails(path, "line 6", "label 'yes'")


@pytest.mark.parametrize("split", ["val", "test"])
def test_check_refuses_a_split_with_one_class(tmp_path, split):
    root = tmp_path / "shared"
    rows = _png_rows(root, "a", 12, 40, split=True)
    for row in rows:
        if row["split"] == split:
            row["label"] = "0"
    _write_csv(root / "a.csv", rows)
    path = _site_file(tmp_path, "a", {"spec": "csv:shared/a.csv"})
    known = sum(r["split"] == split for r in rows)
    _check_fails(
        path, f"the {split} split of site 'a' has only negative 'label' labels",
        f"(0 positive of {known})", "AUC is undefined",
    )  # fmt: skip


def test_check_refuses_an_empty_site(tmp_path):
    root = tmp_path / "shared"
    _shared_csv(root, split=True)
    path = _site_file(tmp_path, "c", {"spec": "csv:shared/all.csv", "site": "c"})
    _check_fails(path, "no rows with site 'c'", str(root / "all.csv"))

    rows = _png_rows(root, "a", 12, 40, split=True)
    _write_csv(root / "nosite.csv", [{k: v for k, v in r.items() if k != "site"} for r in rows])
    path = _site_file(tmp_path, "n", {"spec": "csv:shared/nosite.csv", "site": "a"})
    _check_fails(path, f"{root / 'nosite.csv'}: no site column")

    (root / "header.csv").write_text("Path,label,split\n")
    path = _site_file(tmp_path, "h", {"spec": "csv:shared/header.csv"})
    _check_fails(path, f"{root / 'header.csv'}: no rows to read")


def test_check_refuses_a_site_file_that_is_missing_or_names_a_missing_data_file(tmp_path):
    _check_fails(tmp_path / "nowhere.toml", "cannot read site file")
    path = _site_file(tmp_path, "n", {"spec": "medmnist:gone.npz"})
    _check_fails(path, f"medmnist file {tmp_path / 'gone.npz'} not found")


# -- (c) the start check: a node with broken data never connects --------------------------------
def test_a_node_with_broken_data_refuses_before_connecting(tmp_path, monkeypatch):
    connected = []
    from fed_auc.transport.flower import launch

    monkeypatch.setattr(launch, "run_node", lambda *args: connected.append(args) or 0)
    root = tmp_path / "shared"
    rows = _png_rows(root, "a", 12, 40, split=True)
    _write_csv(root / "a.csv", rows)
    path = _site_file(tmp_path, "a", {"spec": "csv:shared/a.csv"})
    coordinator = ("--coordinator", "127.0.0.1:1", "--insecure")
    assert _node(path, *coordinator) == 0  # good data: it goes on to serve the site
    assert [(args[0].name, args[1]) for args in connected] == [("a", "127.0.0.1:1")]

    rows[2]["label"] = "7"
    _write_csv(root / "a.csv", rows)
    with pytest.raises(SystemExit, match=r"a.csv line 4, column 'label': label '7'"):
        _node(path, *coordinator)
    (root / rows[0]["Path"]).unlink()
    rows[2]["label"] = "1"
    _write_csv(root / "a.csv", rows)
    with pytest.raises(SystemExit, match=r"a.csv line 2: image .*p000_1.png not found"):
        _node(path, *coordinator)
    assert len(connected) == 1  # neither broken site got as far as connecting


# -- (d) fed-auc simulate --site / --sites-dir -------------------------------------------------
SIMULATE = ["--rounds", "1", "--model", "tiny", "--local-steps", "1", "--batch-size", "8",
            "--image-size", str(SIZE), "--json"]  # fmt: skip


def _npz_sites(folder: Path, names: list[str]) -> list[Path]:
    paths = []
    for i, name in enumerate(names):
        folder.mkdir(parents=True, exist_ok=True)
        write_npz(folder / f"{name}.npz", n=(24, 8, 10), seed=i)
        paths.append(_site_file(folder, name, {"spec": f"medmnist:{name}.npz"}))
    return paths


def test_simulate_runs_exactly_the_site_files_given(tmp_path, capsys):
    a, b, _ = _npz_sites(tmp_path / "sites", ["east", "west", "south"])
    runs = str(tmp_path / "runs")
    assert (
        main(["simulate", "--site", str(a), "--site", str(b), "--runs-dir", runs, *SIMULATE]) == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert set(summary["site_auc"]) == {"east", "west"} and len(summary["global_auc"]) == 2


def test_simulate_sites_dir_runs_every_site_file_of_the_folder(tmp_path, capsys):
    _npz_sites(tmp_path / "sites", ["east", "west", "south"])
    (tmp_path / "sites" / "notes.txt").write_text("not a site file")
    runs = str(tmp_path / "runs")
    assert main(["simulate", "--sites-dir", str(tmp_path / "sites"), "--runs-dir", runs,
                 *SIMULATE]) == 0  # fmt: skip
    assert set(json.loads(capsys.readouterr().out)["site_auc"]) == {"east", "west", "south"}
    with pytest.raises(SystemExit, match="--sites-dir: sites directory .*no \\*.toml site file"):
        main(["simulate", "--sites-dir", str(tmp_path / "runs"), *SIMULATE])


def test_simulate_refuses_sites_with_site_files(tmp_path):
    (a,) = _npz_sites(tmp_path / "sites", ["east"])
    with pytest.raises(SystemExit, match="give --sites or site files"):
        main(["simulate", "--sites", "3", "--site", str(a), *SIMULATE])
    with pytest.raises(SystemExit, match="give --sites or site files"):
        main(["simulate", "--sites", "3", "--sites-dir", str(tmp_path / "sites"), *SIMULATE])


def test_simulate_refuses_two_site_files_with_one_name(tmp_path):
    (a,) = _npz_sites(tmp_path / "one", ["east"])
    (b,) = _npz_sites(tmp_path / "two", ["east"])
    with pytest.raises(SystemExit, match=f"site name 'east' is in both {a} and {b}"):
        main(["simulate", "--site", str(a), "--site", str(b), *SIMULATE])


# -- (e) the Flower extra ----------------------------------------------------------------------
@pytest.mark.parametrize("missing", ["flwr", "cryptography"])
def test_require_flower_names_the_extra_to_install(monkeypatch, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # `import flwr` now fails
    with pytest.raises(SystemExit) as error:
        require_flower("node")
    assert str(error.value.code) == (
        f"fed-auc node needs the Flower extra ({missing} is missing): "
        "pip install -c constraints.txt 'fed-auc[flower]'"
    )


def test_a_node_without_flower_says_so_after_checking_its_data(tmp_path, monkeypatch):
    write_npz(tmp_path / "north.npz", n=(30, 10, 12))
    path = _site_file(tmp_path, "north", {"spec": "medmnist:north.npz"})
    real_import = builtins.__import__

    def no_flower(name, *args, **kwargs):
        if name == "flwr" or name.startswith("flwr."):
            raise ImportError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_flower)
    with pytest.raises(SystemExit, match=r"fed-auc node needs the Flower extra \(flwr is missing"):
        _node(path, "--coordinator", "127.0.0.1:1", "--insecure")
    assert _node(path, "--check") == 0  # --check needs no Flower


# -- (f) memory budgets ------------------------------------------------------------------------
def test_memory_budget_auto_resolves_to_the_free_bytes_and_sizes_and_fractions_parse(tmp_path):
    write_npz(tmp_path / "north.npz")
    budgets = {}
    for value in ("auto", "6GiB", 0.4, 2_000_000):
        path = _site_file(tmp_path, "north", {"spec": "medmnist:north.npz"},
                          {"memory_budget": value})  # fmt: skip
        budgets[value] = SiteDefinition.from_toml(path).budget()
    auto = budgets["auto"]
    assert isinstance(auto, int) and not isinstance(auto, bool) and auto > 0
    assert parse_budget(auto) == MemoryBudget(bytes=auto)
    assert parse_budget(budgets["6GiB"]) == MemoryBudget(bytes=6 * 2**30)
    assert parse_budget(budgets[0.4]) == MemoryBudget(fraction=0.4)
    assert parse_budget(budgets[2_000_000]) == MemoryBudget(bytes=2_000_000)
    path = _site_file(tmp_path, "north", {"spec": "medmnist:north.npz"})
    assert SiteDefinition.from_toml(path).budget() is None  # no budget: no partial training


def test_available_memory_falls_back_to_sysconf_without_proc_meminfo(monkeypatch):
    assert available_memory() > 0
    real_open = builtins.open

    def no_meminfo(file, *args, **kwargs):
        if str(file) == "/proc/meminfo":
            raise OSError("no /proc here")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_meminfo)
    assert available_memory() > 0
