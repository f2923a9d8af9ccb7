"""Dashboard pages under Streamlit's AppTest, against a store a test fills."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from streamlit import config
from streamlit.testing.v1 import AppTest

from app.common import RUNS_DIR_ENV
from app.pages import DEFAULT_PAGE
from tests.support.paths import ROOT

APP = str(ROOT / "app" / "streamlit_app.py")


@contextmanager
def streamlit_option(name: str, value: Any) -> Iterator[None]:
    """A Streamlit server option (as ``--server.address`` gives it) for the apps run inside
    (tests/conftest.py serves every app on loopback)."""
    before = config.get_option(name)
    config.set_option(name, value)
    try:
        yield
    finally:
        config.set_option(name, before)


def open_page(monkeypatch, runs_dir, page: str, run_id: str | None = None) -> AppTest:
    monkeypatch.setenv(RUNS_DIR_ENV, str(runs_dir))
    at = AppTest.from_file(APP, default_timeout=60).run()
    if run_id is not None:
        at.sidebar.selectbox(key="run_id").select(run_id).run()
    if page != DEFAULT_PAGE.key:
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def texts(at: AppTest) -> str:
    parts = [*at.info, *at.error, *at.caption, *at.markdown, *at.subheader, *at.warning]
    return "\n".join(str(p.value) for p in parts)
