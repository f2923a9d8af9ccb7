"""The demo federation's site files for real Flower runs on loopback."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.paths import ROOT

HOSPITALS = ROOT / "hospitals"


SITES = ["st_elsewhere", "county_general", "mercy_rural"]


UNREGISTERED, NO_CA = "northgate_icu", "lakeside_clinic"  # intruders: indexes 4 and 3


INDEX = {"st_elsewhere": 0, "county_general": 1, "mercy_rural": 2, NO_CA: 3, UNREGISTERED: 4}


SCALE = 0.15  # of every split of the demo hospitals: seconds per round


def _site_toml(root: Path, site: str) -> Path:
    """The demo hospital's site file, its splits scaled down, its state under ``root``."""
    text = (HOSPITALS / f"{site}.toml").read_text().split("\n[node]")[0]
    for split in ("n_train", "n_val", "n_test"):
        text = re.sub(
            rf"^{split} = (\d+)",
            lambda m, split=split: f"{split} = {max(2, round(int(m.group(1)) * SCALE))}",
            text,
            flags=re.M,
        )
    state = root / "nodes" / site
    path = root / f"{site}.toml"
    path.write_text(f'{text}\n[node]\nindex = {INDEX[site]}\nstate_dir = "{state}"\n')
    return path
