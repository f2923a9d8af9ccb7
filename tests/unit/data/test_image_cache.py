"""The on-disk image cache (fed_auc.data.cache, fed_auc.data.memmap): the same batches as the
in-memory pool it replaces, rebuilt whenever what it was decoded from changes or a build was
torn, another site's cache refused, and splits scored through a DataLoader. Played as a
local user: a cache file overwritten at rest is rebuilt, one changed under a running node is
refused by name, and nobody but the node's user can read it."""

from __future__ import annotations

import csv
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fed_auc.data.csv_images as csv_images
from fed_auc.data.cache import CACHE_FOLDER, MANIFEST
from fed_auc.data.cards import intensity, site_summary
from fed_auc.data.memmap import CachedImages, gather
from fed_auc.data.poisson import PoissonBatches
from fed_auc.data.sampling import BatchStream
from fed_auc.data.spec import site_from_config
from fed_auc.models import model_from_config
from fed_auc.site import SiteDefinition
from fed_auc.tta import predict
from tests.support.data_files import write_npz, write_png
from tests.support.paths import ROOT

SIZE = 16
QUANTUM = 0.5 / 255 + 1e-6  # a cached pixel is the decoded one rounded to a multiple of 1/255


def _csv(folder: Path, rows: int, flip: int | None = None) -> Path:
    """``rows`` PNGs (every third positive, brighter) and their CSV; ``flip``: that row's
    label inverted."""
    lines = []
    for i in range(rows):
        label = int(i % 3 == 0) ^ int(i == flip)
        rel = f"img/{i:04d}.png"
        if not (folder / rel).exists():
            write_png(folder / rel, 150 if i % 3 == 0 else 90, seed=i, size=20)
        lines.append({"Path": rel, "label": str(label), "patient_id": f"p{i}"})
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "labels.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["Path", "label", "patient_id"])
        writer.writeheader()
        writer.writerows(lines)
    return folder / "labels.csv"


def _site(folder: Path, name: str = "north", spec: str = "csv:data/labels.csv", **data) -> Path:
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in data.items())
    path = folder / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\n[data]\nspec = "{spec}"\n{extra}[node]\nstate_dir = "state"\n'
    )
    return path


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "state" / CACHE_FOLDER / MANIFEST).read_text())


@pytest.fixture
def decodes(monkeypatch) -> list[Path]:
    """Every image file decoded from now on."""
    seen: list[Path] = []
    read = csv_images.read_image_facts

    def counting(path, *args):
        seen.append(path)
        return read(path, *args)

    monkeypatch.setattr(csv_images, "read_image_facts", counting)
    return seen


def test_the_cache_gives_the_batches_and_images_of_the_in_memory_pool(tmp_path, monkeypatch):
    _csv(tmp_path / "data", 90)
    site = SiteDefinition.from_toml(_site(tmp_path))
    cached = site.load(SIZE)
    memory = site_from_config(site.name, site.data, SIZE)  # no cache: every image in memory
    assert isinstance(cached.train.images, CachedImages)
    assert isinstance(memory.train.images, torch.Tensor)
    for split in ("train", "val", "test"):
        a, b = getattr(cached, split), getattr(memory, split)
        assert torch.equal(a.labels, b.labels)
        assert (gather(a.images) - b.images).abs().max() <= QUANTUM
    here = []  # batches read in this process, not by the DataLoader's workers
    load = CachedImages.load
    monkeypatch.setattr(CachedImages, "load", lambda view: here.append(1) or load(view))
    for stream in (BatchStream, PoissonBatches):
        here.clear()
        one, two = (
            stream(d.train, 8, seed=5, min_pos_fraction=0.5, min_neg_fraction=0.25)
            for d in (cached, memory)
        )
        one.workers = 2  # DataLoader workers read ahead (off by default)
        for _ in range(12):
            x, y = next(one), next(two)
            assert torch.equal(x.weights, y.weights) and torch.equal(x.labels, y.labels)
            assert (x.images - y.images).abs().max() <= QUANTUM
        assert len(here) == 1  # the first batch; the workers read the next ones ahead
        resumed = stream(cached.train, 8, seed=0, min_pos_fraction=0.5, min_neg_fraction=0.25)
        resumed.load_state_dict(one.state_dict())  # resume: the same next batches
        for _ in range(4):
            assert torch.equal(next(resumed).images, next(one).images)
    full = torch.cat([x for x, _ in BatchStream(cached.train, 8).full_pass(7)])
    assert torch.equal(full, gather(cached.train.images))


def test_a_second_load_reads_the_cache_and_decodes_nothing(tmp_path, decodes):
    _csv(tmp_path / "data", 30)
    site = SiteDefinition.from_toml(_site(tmp_path))
    first = site.load(SIZE)
    assert len(decodes) == 30
    again = site.load(SIZE)
    assert len(decodes) == 30
    assert torch.equal(gather(again.test.images), gather(first.test.images))


@pytest.mark.parametrize(
    "change",
    ["row added", "label changed", "image rewritten", "image size", "positive label", "uncertain"],
)
def test_a_cache_whose_source_or_settings_changed_is_rebuilt(tmp_path, decodes, change):
    data = tmp_path / "data"
    _csv(data, 30)
    size, settings = SIZE, {}
    SiteDefinition.from_toml(_site(tmp_path)).load(SIZE)
    key = _manifest(tmp_path)["key"]
    decodes.clear()
    if change == "row added":
        _csv(data, 31)
    elif change == "label changed":
        _csv(data, 30, flip=4)
    elif change == "image rewritten":  # same name, new pixels (and size/mtime)
        write_png(data / "img/0002.png", 250, seed=99, size=24)
    elif change == "image size":
        size = 12
    elif change == "positive label":
        settings = {"positive_label": 0}
    else:
        settings = {"uncertain": "ones"}
    loaded = SiteDefinition.from_toml(_site(tmp_path, **settings)).load(size)
    assert _manifest(tmp_path)["key"] != key
    assert len(decodes) == (31 if change == "row added" else 30)
    memory = site_from_config(
        "north", SiteDefinition.from_toml(_site(tmp_path, **settings)).data, size
    )
    assert (gather(loaded.train.images) - memory.train.images).abs().max() <= QUANTUM
    assert torch.equal(loaded.train.labels, memory.train.labels)
    assert len(list((tmp_path / "state" / CACHE_FOLDER).glob("images-*"))) == 1  # old one gone


def test_a_torn_cache_is_rebuilt(tmp_path, decodes):
    _csv(tmp_path / "data", 30)
    site = SiteDefinition.from_toml(_site(tmp_path))
    first = gather(site.load(SIZE).train.images)
    folder = tmp_path / "state" / CACHE_FOLDER
    (images,) = folder.glob("images-*.npy")
    with images.open("r+b") as f:  # cut off mid-image
        f.truncate(images.stat().st_size - 100)
    decodes.clear()
    assert torch.equal(gather(site.load(SIZE).train.images), first)
    assert len(decodes) == 30
    (folder / MANIFEST).write_text('{"format": 1, "own')  # a manifest cut short
    decodes.clear()
    assert torch.equal(gather(site.load(SIZE).train.images), first)
    assert len(decodes) == 30


def test_a_build_killed_mid_write_leaves_nothing_that_looks_complete(tmp_path, decodes):
    """A process killed while it writes the cache (another image size than the complete
    cache already there): the next load neither takes the old cache nor the torn build."""
    _csv(tmp_path / "data", 30)
    site_file = _site(tmp_path)
    SiteDefinition.from_toml(site_file).load(SIZE)
    crash = (
        "import os, sys\n"
        "import fed_auc.data.csv_images as c\n"
        "from fed_auc.site import SiteDefinition\n"
        "read, seen = c.read_image_facts, []\n"
        "def dying(*args):\n"
        "    seen.append(1)\n"
        "    if len(seen) == 10: os._exit(9)\n"
        "    return read(*args)\n"
        "c.read_image_facts = dying\n"
        "SiteDefinition.from_toml(sys.argv[1]).load(12)\n"
    )
    done = subprocess.run([sys.executable, "-c", crash, str(site_file)], cwd=ROOT, timeout=120)
    assert done.returncode == 9
    decodes.clear()
    loaded = SiteDefinition.from_toml(site_file).load(12)
    assert len(decodes) == 30 and loaded.train.images.shape[-1] == 12
    memory = site_from_config("north", SiteDefinition.from_toml(site_file).data, 12)
    assert (gather(loaded.train.images) - memory.train.images).abs().max() <= QUANTUM
    assert not list((tmp_path / "state" / CACHE_FOLDER).glob("*.partial-*"))


def test_a_cache_of_another_site_or_source_is_refused(tmp_path):
    _csv(tmp_path / "data", 30)
    _csv(tmp_path / "other", 24)
    SiteDefinition.from_toml(_site(tmp_path)).load(SIZE)
    south = SiteDefinition.from_toml(_site(tmp_path, name="south"))  # the same state_dir
    with pytest.raises(ValueError, match=r"site 'north'.*not site 'south'.*own state_dir"):
        south.load(SIZE)
    moved = SiteDefinition.from_toml(_site(tmp_path, spec="csv:other/labels.csv"))
    with pytest.raises(ValueError, match=r"other/labels\.csv"):
        moved.load(SIZE)


def test_a_medmnist_site_streams_from_its_cache(tmp_path):
    write_npz(tmp_path / "tiny.npz", n=(40, 12, 14))
    site = SiteDefinition.from_toml(_site(tmp_path, spec="medmnist:tiny.npz"))
    cached = site.load(12)
    memory = site_from_config(site.name, site.data, 12)
    assert isinstance(cached.train.images, CachedImages)
    for split in ("train", "val", "test"):
        a, b = getattr(cached, split), getattr(memory, split)
        assert torch.equal(a.labels, b.labels) and len(a) == len(b)
        assert (gather(a.images) - b.images).abs().max() <= QUANTUM
    assert torch.equal(gather(site.load(12).val.images), gather(cached.val.images))


def test_a_cached_split_is_scored_through_worker_processes_as_in_memory(tmp_path):
    _csv(tmp_path / "data", 60)
    images = SiteDefinition.from_toml(_site(tmp_path)).load(SIZE).train.images
    model = model_from_config({"arch": "tiny", "num_labels": 1})
    streamed = predict(model, images, "flip", batch=8)  # 6 chunks, 2 worker processes
    assert np.array_equal(streamed, predict(model, gather(images), "flip", batch=8))
    assert intensity(images) == pytest.approx(intensity(gather(images)), rel=1e-5)


PEAK_RSS = """
import resource, sys
from fed_auc.cli import main
main(["node", "--site", sys.argv[1], "--check", "--image-size", "64"])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux
"""
MARGIN_KIB = 30 * 1024  # 2,000 more 64-px images held as float32 would add 2 × 31 MiB


@pytest.mark.slow
def test_check_peak_memory_does_not_grow_with_the_number_of_images(tmp_path):
    """``fed-auc node --check`` over 1,000 and over 3,000 PNGs, each in its own process:
    the images stay on disk, so the peak resident memory is the same but for a margin."""
    peaks = {}
    for n in (1000, 3000):
        folder = tmp_path / str(n)
        lines = []
        for i in range(n):
            write_png(folder / f"img/{i:05d}.png", 150 if i % 3 == 0 else 90, seed=i, size=64)
            lines.append(f"img/{i:05d}.png,{int(i % 3 == 0)},p{i}")
        (folder / "labels.csv").write_text("Path,label,patient_id\n" + "\n".join(lines) + "\n")
        site = _site(folder, spec="csv:labels.csv")
        done = subprocess.run(
            [sys.executable, "-c", PEAK_RSS, str(site)],
            cwd=ROOT, capture_output=True, text=True, timeout=600, check=True,
        )  # fmt: skip
        assert f"({int(n * 0.7)} training images)" in done.stdout
        peaks[n] = int(done.stdout.split()[-1])
    assert peaks[3000] <= peaks[1000] + MARGIN_KIB, peaks


def _images_file(folder: Path) -> Path:
    (images,) = (folder / "state" / CACHE_FOLDER).glob("images-*.npy")
    return images


def _overwrite(path: Path, keep_times: bool = False) -> None:
    """The local user's edit: every pixel after the header set to 0, the size unchanged (and
    with ``keep_times`` the modification time put back)."""
    before = path.stat()
    data = bytearray(path.read_bytes())
    header = len(data) - _manifest(path.parents[2])["rows"] * SIZE**2
    data[header:] = bytes(len(data) - header)
    with path.open("r+b") as f:
        f.write(data)
    if keep_times:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_cache_file_overwritten_at_rest_is_rebuilt_with_a_warning_naming_it(tmp_path, decodes):
    _csv(tmp_path / "data", 30)
    site = SiteDefinition.from_toml(_site(tmp_path))
    first = gather(site.load(SIZE).train.images)
    images = _images_file(tmp_path)
    _overwrite(images, keep_times=True)  # the size and mtime an attacker can keep
    decodes.clear()
    with pytest.warns(UserWarning, match=rf"{images}.*SHA-256.*rebuilding"):
        again = gather(site.load(SIZE).train.images)
    assert len(decodes) == 30  # decoded again from the source images
    assert torch.equal(again, first)
    assert gather(site.load(SIZE).train.images).equal(first)  # and verified from now on


def test_a_cache_overwritten_whose_source_images_are_gone_is_refused_naming_the_image(tmp_path):
    _csv(tmp_path / "data", 30)
    site = SiteDefinition.from_toml(_site(tmp_path))
    site.load(SIZE)
    _overwrite(_images_file(tmp_path), keep_times=True)
    (tmp_path / "data" / "img" / "0003.png").unlink()
    with pytest.raises(ValueError, match=r"line 5: image .*0003\.png not found"):
        site.load(SIZE)


@pytest.mark.parametrize("change", ["truncated", "rewritten in place", "replaced", "deleted"])
def test_a_cache_file_changed_under_a_running_node_is_refused_naming_it_and_the_remedy(
    tmp_path, change
):
    _csv(tmp_path / "data", 30)
    data = SiteDefinition.from_toml(_site(tmp_path)).load(SIZE)
    batch = data.train.images[[0, 1, 5, 6, 7]]
    before = gather(batch)
    images = _images_file(tmp_path)
    if change == "truncated":
        os.truncate(images, images.stat().st_size // 2)
    elif change == "rewritten in place":
        _overwrite(images, keep_times=True)
    elif change == "replaced":
        copy = images.with_suffix(".copy")
        copy.write_bytes(images.read_bytes())
        os.replace(copy, images)
    else:
        images.unlink()
    with pytest.raises(ValueError, match=rf"image cache file {images} .*delete .*start the node"):
        gather(batch)
    assert before.shape == (5, 1, SIZE, SIZE)


def test_cache_files_are_readable_by_the_node_user_only(tmp_path):
    _csv(tmp_path / "data", 30)
    old = os.umask(0o022)  # the usual umask: without care, files every local user can read
    try:
        SiteDefinition.from_toml(_site(tmp_path)).load(SIZE)
    finally:
        os.umask(old)
    folder = tmp_path / "state" / CACHE_FOLDER
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for path in (folder / MANIFEST, _images_file(tmp_path)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_the_summary_sent_at_registration_names_a_cache_truncated_under_the_node(tmp_path):
    """Issue 37: a node whose cache was truncated while it ran failed its registration with
    numpy's "mmap length is greater than file size", naming no cache and no remedy."""
    _csv(tmp_path / "data", 30)
    data = SiteDefinition.from_toml(_site(tmp_path)).load(SIZE)
    images = _images_file(tmp_path)
    os.truncate(images, 200)
    with pytest.raises(ValueError, match=rf"{images} was replaced.*truncated.*delete"):
        site_summary(data)
