"""The dashboard in real Chromium: `fed-auc dashboard` on a loopback port, every page visited,
the ROC threshold moved with the keyboard, screenshots kept as test artifacts.

Screenshots go to $FED_AUC_SCREENSHOTS if set, else to the test's tmp_path.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.screenshots import CHROMIUM, PAGES, capture, serve
from fed_auc.store.run_store import RunStore
from tests.support.dashboard_store import THRESHOLD, fill

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"),
]


def test_every_page_in_a_real_browser(tmp_path):
    fill(tmp_path / "runs")
    shots = Path(os.environ.get("FED_AUC_SCREENSHOTS", tmp_path / "screenshots"))
    with serve(tmp_path / "runs") as url:
        texts = capture(url, shots, run_id="run-complete", threshold_steps=-20)
    assert sorted(texts) == sorted([*PAGES, "ROC at start"])
    for name in PAGES:
        text = texts[name]
        assert "Run run-complete · codasca · completed · round 2 of 2" in text, name
        assert "Synthetic data" in text, name
        assert "Traceback" not in text, name
        assert (shots / f"{name.lower().replace(' ', '_')}.png").stat().st_size > 10_000
    overview = texts["Overview"]
    assert overview.index("Exported model (round 1 of 2)") < overview.index("Last round (2 of 2)")
    with RunStore(tmp_path / "runs") as store:
        rows = store.site_rounds("run-complete")
    south = rows[(rows["site"] == "south") & (rows["round"] == 1)]["auc"].iloc[0]
    assert f"south not scored since round 2 (dropped); last AUC {south:.3f} at round 1" in overview
    assert "3 of 4" in overview and "4 of 4" in overview
    assert "Sites scored" in texts["Sites"]
    assert "Site × site similarity" in texts["Heterogeneity"]
    assert "Traffic: 6.0 MB down, 4.0 MB up" in texts["Participation"]
    assert texts["ROC at start"] == f"At threshold {THRESHOLD:.3f}"
    assert f"At threshold {THRESHOLD - 0.020:.3f}" in texts["ROC"]
    assert f"At threshold {THRESHOLD:.3f}" in texts["Operating point"]
    assert "Brier score" in texts["Operating point"]
