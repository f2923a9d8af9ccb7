"""benchmarks/systems/dashboard_pages.py at toy size: the store it fills is a run the dashboard
reads (a dropped site, an export with bins), and every page renders on it."""

from __future__ import annotations

import pytest

from app import queries  # noqa: E402
from app.model_view import choices, coverage, site_status  # noqa: E402
from benchmarks.systems import dashboard_pages


def test_the_filled_run_has_a_dropped_site_and_an_export(tmp_path):
    run_id = dashboard_pages.fill(tmp_path, sites=5, rounds=8)
    data = queries.run_data(tmp_path, run_id)
    exported, last = choices(data)
    assert exported.round == 7 and exported.thresholds == [dashboard_pages.THRESHOLD]
    cover = coverage(site_status(data, last))
    assert cover.missing == ["site_04"] and len(cover.scored) == 4
    assert sorted(data.evaluations["site"]) == [f"site_{i:02d}" for i in range(4)]


@pytest.mark.slow
def test_every_page_renders_and_is_timed_in_a_fresh_process(tmp_path):
    run_id = dashboard_pages.fill(tmp_path / "runs", sites=3, rounds=4)
    times = dashboard_pages.render_times(dashboard_pages.ROOT, tmp_path / "runs", run_id)
    assert {f"{v}:{p}" for v in ("cold", "warm") for p in dashboard_pages.PAGES} == set(times)
    assert all(t > 0 for t in times.values())
