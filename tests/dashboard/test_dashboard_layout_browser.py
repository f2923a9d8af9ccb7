"""What the pages look like in real Chromium at a 1280 px wide window: heat maps with one
visible row per site, forest plots with every row labelled, wide tables with every column in
view, the run the dashboard opens on, the jobs that scored a training run's model.

One dashboard server and one browser for the whole module; each test opens a fresh tab.
Screenshots go to $FED_AUC_SCREENSHOTS if set, else to a temporary folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.screenshots import CHROMIUM, TIMEOUT_MS, serve, wait_until_idle
from tests.support.dashboard_store import fill, fill_evaluation_job, fill_sized

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"),
]

WIDTH = 1280
N_SITES = 5
ROUNDS = 3
MIN_ROW_PX = 15  # a heat-map row a reader can point at


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """``fill``'s runs, a 5-site run, then (newest) an evaluation job that scored the model
    run-complete exported."""
    path = tmp_path_factory.mktemp("runs")
    fill(path)
    sized = fill_sized(path, N_SITES, ROUNDS)
    job = fill_evaluation_job(path, "run-complete", held_out=("south",))
    return {"path": path, "sized": sized, "job": job}


@pytest.fixture(scope="module")
def browser(store):
    from playwright.sync_api import sync_playwright

    with serve(store["path"]) as url, sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield SimpleNamespace(chromium=chromium, url=url)
        chromium.close()


@pytest.fixture
def shots(tmp_path) -> Path:
    out = Path(os.environ.get("FED_AUC_SCREENSHOTS", tmp_path))
    out.mkdir(parents=True, exist_ok=True)
    return out


def visit(browser, name: str | None = None, run_id: str | None = None):
    """A new tab at the dashboard, ``run_id`` picked in the sidebar, page ``name`` open."""
    page = browser.chromium.new_page(viewport={"width": WIDTH, "height": 1000})
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(browser.url)
    picker = page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]')
    picker.wait_for()
    if run_id is not None:
        picker.click()
        page.get_by_role("option", name=run_id).click()
        page.get_by_text(f"Run {run_id} ·").first.wait_for()
    if name is not None:
        page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name=name).click()
        page.get_by_role("heading", name=name).first.wait_for()
    wait_until_idle(page)
    return page


CHARTS = """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')].map(c => {
    const svg = c.querySelector('svg');
    const box = r => { const b = r.getBoundingClientRect(); return [b.x, b.y, b.width, b.height]; };
    const axis = a => [...a.querySelectorAll('g.role-axis-label text')]
        .filter(t => t.getAttribute('opacity') !== '0' && getComputedStyle(t).opacity !== '0')
        .map(t => t.textContent);
    const axes = [...svg.querySelectorAll('g.role-axis')];
    const marks = sel => [...svg.querySelectorAll(sel)]
        .filter(m => !m.closest('g.role-legend')).map(box);  // data marks, not the legend's
    return {
        container: box(c), svg: box(svg),
        rects: marks('g.mark-rect path'),
        rules: marks('g.mark-rule line, g.mark-rule path'),
        y: axes.filter(a => (a.getAttribute('aria-label') || '').startsWith('Y-axis')).map(axis),
        x: axes.filter(a => (a.getAttribute('aria-label') || '').startsWith('X-axis')).map(axis),
    };
})"""


def charts(page) -> list[dict]:
    """Every chart's SVG: its marks' boxes and the axis labels drawn (opacity > 0)."""
    return page.evaluate(CHARTS)


def test_heat_maps_draw_one_visible_row_per_site(browser, store, shots):
    for name in ("Heterogeneity", "Participation"):
        page = visit(browser, name, store["sized"])
        page.screenshot(path=str(shots / f"layout_{name.lower()}.png"), full_page=True)
        maps = [c for c in charts(page) if c["rects"]]
        assert maps, name
        heat = maps[0]  # the site × site similarity; the round × site status
        rows = sorted({round(r[1]) for r in heat["rects"]})
        heights = {round(r[3]) for r in heat["rects"]}
        assert len(rows) == N_SITES, (name, rows, heat["svg"])
        assert min(heights) >= MIN_ROW_PX, (name, heights)
        assert heat["y"] and sorted(heat["y"][0]) == [f"site_{i:02d}" for i in range(N_SITES)]
        columns = {round(r[0]) for r in heat["rects"]}
        assert len(columns) == (N_SITES if name == "Heterogeneity" else ROUNDS), name
        assert heat["svg"][2] <= heat["container"][2] + 1, name  # nothing drawn off the page
        page.close()


def test_the_sites_forest_plot_labels_every_row(browser, shots):
    page = visit(browser, "Sites", "run-complete")
    page.screenshot(path=str(shots / "layout_sites.png"), full_page=True)
    (forest,) = [c for c in charts(page) if c["rules"]]
    defined = ["north", "south", "west"]  # east: one class, no AUC, no row
    assert forest["y"] and sorted(forest["y"][0]) == defined, forest["y"]
    ci_rows = {round(r[1] + r[3] / 2) for r in forest["rules"] if r[3] < 5}  # horizontal CIs
    assert len(ci_rows) == len(defined), forest["rules"]
    page.close()


TABLE = """d => {
    const scroller = d.querySelector('.dvn-scroller');
    return {
        width: scroller.clientWidth, content: scroller.scrollWidth,
        right: d.getBoundingClientRect().right,
        headers: [...d.querySelectorAll('th, [role=columnheader]')].map(t => t.textContent),
    };
}"""


def tables(page) -> list[dict]:
    """Every st.dataframe: its visible width, the width of its columns, and the headers of
    the columns it draws (the grid renders only the columns in view, and only once the
    table is scrolled into view)."""
    found = []
    grids = page.locator('[data-testid="stDataFrame"]')
    for i in range(grids.count()):
        grid = grids.nth(i)
        grid.scroll_into_view_if_needed()
        grid.locator("th, [role=columnheader]").first.wait_for(state="attached")
        found.append(grid.evaluate(TABLE))
    return found


WIDE = {  # page, run (a name of the store fixture, or an id) → headers that must be in view
    ("Operating point", "run-complete"): ["90 %", "95 %", "Brier", "PPV", "NPV", "FP"],
    ("Overview", "run-complete"): ["AUC", "rounds", "status", "positive class"],
    ("Evaluations", "job"): ["90 %", "95 %", "Brier", "NPV", "bin error ≤"],
    ("Heterogeneity", "sized"): ["prevalence", "train SD", "val mean", "test SD"],
    ("Compare", "run-complete"): ["exported AUC", "last round: worst site", "MB sent"],
    ("Sites", "run-complete"): ["AUC (finding present)", "95 % CI (bootstrap)", "status"],
}


@pytest.mark.parametrize(("name", "run"), list(WIDE))
def test_wide_tables_show_every_column_at_1280_px(browser, store, shots, name, run):
    page = visit(browser, name, store.get(run, run))
    shot = shots / f"layout_tables_{name.lower().replace(' ', '_')}.png"
    page.screenshot(path=str(shot), full_page=True)
    found = tables(page)
    assert found, name
    for table in found:
        assert table["content"] <= table["width"] + 1, (name, table)  # no hidden column
        assert table["right"] <= WIDTH, (name, table)
    headers = " | ".join(h for table in found for h in table["headers"])
    for needle in WIDE[name, run]:
        assert needle in headers, (name, needle, headers)
    page.close()


PICKER = """() => {
    const box = document.querySelector(
        '[data-testid="stSidebar"] [data-testid="stSelectbox"] input');
    return {text: box.value, content: box.scrollWidth, width: box.clientWidth};
}"""


@pytest.mark.parametrize("width", [1280, 1920])
def test_the_run_pickers_label_is_not_cut(browser, store, shots, width):
    """The select box shows the picked run whole (id · kind), the longest id of the store
    (an evaluation job's, as the CLI makes it) included; the full label is written under it."""
    for run_id in (store["job"], "run-complete"):
        page = visit(browser, "Overview" if run_id != store["job"] else None, run_id)
        page.set_viewport_size({"width": width, "height": 1000})
        wait_until_idle(page)
        page.screenshot(path=str(shots / f"layout_picker_{width}.png"))
        box = page.evaluate(PICKER)
        assert run_id in box["text"], box
        assert box["content"] <= box["width"], box  # nothing scrolled out of the box
        sidebar = page.locator('[data-testid="stSidebar"]').inner_text()
        assert "positive class" in sidebar and "AUC" in sidebar, sidebar[:400]
        page.close()


def test_the_dashboard_opens_on_the_newest_training_run(browser, store, shots):
    page = visit(browser)  # the newest run is the evaluation job
    page.screenshot(path=str(shots / "layout_landing.png"), full_page=True)
    main = page.locator('[data-testid="stMain"]').inner_text()
    assert f"Run {store['sized']} · codasca" in main, main[:300]
    assert "evaluation job" not in main
    page.get_by_role("heading", name="Overview").wait_for()
    page.close()


def test_a_training_runs_evaluations_page_lists_the_jobs_that_scored_its_model(
    browser, store, shots
):
    page = visit(browser, "Evaluations", "run-complete")
    page.screenshot(path=str(shots / "layout_evaluations.png"), full_page=True)
    main = page.locator('[data-testid="stMain"]').inner_text()
    assert "No evaluation job" not in main
    assert f"scored in run {store['job']}" in main, main[:600]
    assert "held out (never trained on): south" in main
    (forest,) = [c for c in charts(page) if c["rules"]]
    rows = ["north", "pooled (east, north, south, west)", "south", "west"]  # east: one class
    assert forest["y"] and sorted(forest["y"][0]) == rows, forest["y"]
    page.close()
