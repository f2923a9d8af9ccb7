"""The dashboard in real Chromium: `fed-auc dashboard` on a loopback port, every page visited,
the ROC threshold moved with the keyboard, screenshots kept as test artifacts.

Screenshots go to $FED_AUC_SCREENSHOTS if set, else to the test's tmp_path.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.screenshots import CHROMIUM, PAGES, capture, serve
from tests.dashboard_store import fill

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"),
]


def test_every_page_in_a_real_browser(tmp_path):
    fill(tmp_path / "runs")
    shots = Path(os.environ.get("FED_AUC_SCREENSHOTS", tmp_path / "screenshots"))
    with serve(tmp_path / "runs") as url:
        texts = capture(url, shots, run_id="run-complete", threshold_steps=-20)
    assert list(texts) == list(PAGES)
    for name, text in texts.items():
        assert "Run run-complete · codasca · completed · round 2 of 2" in text, name
        assert "Traceback" not in text, name
        assert (shots / f"{name.lower()}.png").stat().st_size > 10_000
    assert "Pooled test AUC" in texts["Overview"] and "2 / 2" in texts["Overview"]
    assert "Sites with undefined AUC" in texts["Sites"]
    assert "Site × site similarity" in texts["Heterogeneity"]
    assert "Traffic: 6.0 MB down, 4.0 MB up" in texts["Participation"]
    assert "At threshold 0.30" in texts["ROC"]
