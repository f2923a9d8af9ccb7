"""Hospitals on their own image files as fed-auc processes over Flower: their site files, the
process launcher, the coordinator and what it recorded."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import numpy as np

from fed_auc.store.run_store import RunStore
from tests.support.data_files import write_dicom, write_png
from tests.support.processes import start_fed_auc


def _csv_site(root: Path, name: str, rows: int, dicom: bool) -> Path:
    """A CSV of labelled images; positives are brighter in the centre."""
    rng = np.random.default_rng(len(name))
    folder = root / name
    lines = []
    for i in range(rows):
        label = int(i % 3 == 0)
        if dicom:
            pixels = rng.integers(200, 1800, (16, 16))
            pixels[5:11, 5:11] += 1500 * label
            photometric = "MONOCHROME1" if i % 2 else "MONOCHROME2"
            if photometric == "MONOCHROME1":  # stored inverted: high values are dark
                pixels = 4095 - pixels
            rel = f"img/{i:03d}.dcm"
            write_dicom(folder / rel, pixels, photometric)
        else:
            rel = f"img/{i:03d}.png"
            write_png(folder / rel, 150 if label else 90, seed=i)
        lines.append({"Path": rel, "label": str(label)})
    with (folder / "labels.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["Path", "label"])
        writer.writeheader()
        writer.writerows(lines)
    return folder / "labels.csv"


def _site_file(root: Path, name: str, spec: str, budget: float | None = None) -> Path:
    node = f'state_dir = "state/{name}"\n'
    if budget is not None:
        node += f"memory_budget = {budget}\n"
    path = root / f"{name}.toml"
    path.write_text(f'name = "{name}"\n\n[data]\nspec = "{spec}"\n\n[node]\n{node}')
    return path


def _fed_auc(root: Path, log: str, *args: str) -> subprocess.Popen:
    """``fed-auc *args`` in ``root``, output to ``log``, without PYTHONUNBUFFERED."""
    return start_fed_auc(root, *args, log=root / log, session=True, unbuffered=False)


def _coordinator(root: Path, port: int, name: str, options: dict, **flower) -> subprocess.Popen:
    lines = [f"{k} = {json.dumps(v)}" for k, v in {**options, "runs_dir": name}.items()]
    settings = {
        "address": f"127.0.0.1:{port}",
        "expected_sites": 3,
        "min_nodes": 2,
        "insecure": True,
        "pooled_scoring": True,
        **flower,
    }
    lines += ["[flower]"] + [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    (root / f"{name}.toml").write_text("\n".join(lines) + "\n")
    return _fed_auc(root, f"{name}.log", "coordinator", "--config", f"{name}.toml", "--json")


def _summary(root: Path, name: str, process: subprocess.Popen) -> dict:
    log = root / f"{name}.log"
    assert process.wait(timeout=600) == 0, log.read_text()[-4000:]
    text = log.read_text()
    return json.loads(text[text.index('{\n  "run_id"') :])


def _store(runs: Path, run_id: str):
    with RunStore(runs) as store:
        rows = store.site_rounds(run_id).sort_values(["round", "site"], kind="stable")
        sites = store.sites(run_id).set_index("site")["summary"]
        return rows.reset_index(drop=True), sites.map(json.loads), store.events(run_id)
