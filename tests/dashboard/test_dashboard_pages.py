"""One list of dashboard pages (app/pages.py): every page file is on it, once, and what it says
of a page is what the page does."""

from __future__ import annotations

import ast

from app.access import ROLES
from app.pages import DEFAULT_PAGE, PAGES, ROUND_PAGES, pages_of
from tests.support.paths import ROOT

VIEWS = ROOT / "app" / "views"


def test_every_page_file_is_on_the_one_list_and_every_listed_page_has_its_file():
    files = {p.stem for p in VIEWS.glob("*.py") if p.stem != "__init__"}
    listed = [p.key for p in PAGES]
    unlisted = sorted(files - set(listed))
    assert not unlisted, (
        f"app/views/{unlisted} not in app/pages.py PAGES: the dashboard would never show them"
    )
    assert sorted(listed) == sorted(files), "a page listed twice, or listed without its file"
    assert all((ROOT / "app" / p.file).exists() for p in PAGES)


def test_a_page_draws_the_runs_rounds_exactly_when_the_list_says_so():
    """``rounds`` pages render through ``common.page`` (the run's status banner, live refresh):
    the tests and tools that visit a training run's pages visit exactly these."""
    for page in PAGES:
        calls = {
            ast.unparse(node.func)
            for node in ast.walk(ast.parse((ROOT / "app" / page.file).read_text()))
            if isinstance(node, ast.Call)
        }
        assert ("common.page" in calls) == page.rounds, page.key
    assert set(ROUND_PAGES) == {p for p in PAGES if p.rounds}


def test_every_role_opens_the_default_page_and_an_operator_every_page():
    assert all(DEFAULT_PAGE in pages_of(role) for role in ROLES)
    assert pages_of(ROLES[-1]) == PAGES  # ascending roles: the last sees everything
