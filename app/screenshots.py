"""Drive the running dashboard in real Chromium: visit every page, move the ROC threshold with
the keyboard, save one screenshot per page. Used by the browser test and for docs/:

    python -m app.screenshots --runs-dir /tmp/demo-runs --out docs

Streamlit renders over a websocket, so every step waits for a selector, never for a fixed time.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.launch import start_dashboard, stop
from app.pages import ROUND_PAGES

CHROMIUM = "/usr/bin/chromium"
PAGES = tuple(p.title for p in ROUND_PAGES)  # navigation labels: a training run's pages
HEADINGS = {p.title: p.shown_heading for p in ROUND_PAGES}
TIMEOUT_MS = 60_000


@contextmanager
def serve(runs_dir: str | Path, port: int | None = None) -> Iterator[str]:
    """``fed-auc dashboard`` on a free loopback port; yields its URL once it answers."""
    process, url = start_dashboard(runs_dir, port)
    try:
        yield url
    finally:
        stop(process)


def capture(
    url: str,
    out_dir: str | Path,
    run_id: str | None = None,
    threshold_steps: int = -20,
    pages: tuple[str, ...] = PAGES,
) -> dict[str, str]:
    """Visit every page (picking ``run_id`` first if given); returns each page's visible text.

    On the ROC page the slider moves ``threshold_steps`` steps with the arrow keys; the
    heading it started with is returned as "ROC at start".
    """
    from playwright.sync_api import sync_playwright

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(url)
        page.get_by_role("heading", name="Overview").wait_for()
        if run_id is not None:
            page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').click()
            page.get_by_role("option", name=run_id).click()
            page.get_by_text(f"Run {run_id} ·").wait_for()
        for name in pages:
            nav = page.locator('[data-testid="stSidebarNav"]')
            nav.get_by_role("link", name=name, exact=True).click()
            page.get_by_role("heading", name=HEADINGS[name]).wait_for()
            if name == "ROC" and threshold_steps:
                wait_until_idle(page)
                heading = page.get_by_role("heading", name="At threshold")
                texts["ROC at start"] = heading.inner_text()
                slider = page.get_by_role("slider")
                slider.focus()
                key = "ArrowLeft" if threshold_steps < 0 else "ArrowRight"
                for _ in range(abs(threshold_steps)):
                    page.keyboard.press(key)
                page.wait_for_function(
                    """(before) => [...document.querySelectorAll('h3')].some(
                        h => h.innerText.startsWith('At threshold') && h.innerText !== before)""",
                    arg=texts["ROC at start"],
                )
            wait_until_idle(page)
            page.screenshot(path=str(out / f"{name.lower().replace(' ', '_')}.png"), full_page=True)
            texts[name] = page.locator('[data-testid="stMain"]').inner_text()
        browser.close()
    return texts


def wait_until_idle(page) -> None:
    """Until Streamlit's "running" indicator and every loading skeleton are gone and every
    chart has its canvas."""
    idle = """() => !document.querySelector('[data-testid="stStatusWidget"]')
              && !document.querySelector('[data-testid="stSkeleton"]')
              && [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')]
                   .every(c => c.querySelector('canvas, svg'))"""
    page.wait_for_function(idle)
    page.wait_for_timeout(1500)  # charts mount after the script ends, then draw
    page.wait_for_function(idle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-dir", required=True)
    parser.add_argument("--out", default="docs")
    parser.add_argument("--run-id", help="run to show (default: the newest)")
    parser.add_argument("--pages", nargs="+", default=list(PAGES), choices=PAGES)
    parser.add_argument("--threshold-steps", type=int, default=0, help="ROC slider key presses")
    args = parser.parse_args()
    with serve(args.runs_dir) as url:
        capture(url, args.out, args.run_id, args.threshold_steps, tuple(args.pages))
        for name in args.pages:
            print(Path(args.out) / f"{name.lower().replace(' ', '_')}.png")


if __name__ == "__main__":
    main()
