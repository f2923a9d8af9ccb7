"""Sign-in end to end: a real OpenID Connect provider on loopback (oidc-provider-mock), the
dashboard started with ``fed-auc dashboard --auth oidc``, and Chromium through Playwright.

A clinician sees the clinician pages only, an operator every page, a user the access file does
not name a refusal and no run; a forged and an expired ID token sign nobody in; the audit log
records each sign-in, refusal and sign-out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app import audit
from app.launch import free_port, start_dashboard, stop
from app.screenshots import CHROMIUM
from tests.support.dashboard_store import fill
from tests.support.oidc_provider import provider

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"),
]

USERS = {
    "ana": {"email": "ana@north.example", "email_verified": True},
    "olu": {"email": "olu@north.example", "groups": ["fed-auc-operators"]},
    "eve": {"email": "eve@north.example"},
}
ACCESS = """
[[people]]
email = "ana@north.example"
role = "clinician"

[[people]]
claim = "groups"
value = "fed-auc-operators"
role = "operator"

[[restricted]]
run = "run-other"
visible_to = [{ claim = "groups", value = "fed-auc-operators" }]
"""
CLINICIAN_PAGES = ["Overview", "Sites", "ROC", "Operating point", "Evaluations"]
OPERATOR_PAGES = [
    "Overview", "Sites", "Heterogeneity", "Participation", "Compare", "ROC",
    "Operating point", "Evaluations",
]  # fmt: skip
RUN_IDS = ("run-complete", "run-other", "run-one", "run-failed", "run-live")
TIMEOUT_MS = 90_000


def _sign_in(browser, url: str, sub: str):
    """A fresh browser context (no cookies): the dashboard, Sign in, the provider's button."""
    context = browser.new_context(viewport={"width": 1400, "height": 1200})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("button", name=sub, exact=True).click()  # the provider's sign-in page
    page.wait_for_url(f"{url}/**")
    return context, page


def _nav(page) -> list[str]:
    links = page.locator('[data-testid="stSidebarNav"] a')
    links.first.wait_for()
    return [t.strip() for t in links.all_inner_texts()]


def test_sign_in_roles_refusal_forgery_expiry_and_audit(tmp_path, monkeypatch):
    from playwright.sync_api import sync_playwright

    fill(tmp_path / "runs")
    (tmp_path / "access.toml").write_text(ACCESS)
    log = tmp_path / "audit" / "dashboard-audit.log"
    with provider(USERS) as idp:
        port = free_port()
        (tmp_path / "dashboard.toml").write_text(
            f'auth = "oidc"\naccess_file = "{tmp_path / "access.toml"}"\n'
            f'audit_log = "{log}"\n\n[oidc]\nserver_metadata_url = "{idp.metadata_url}"\n'
            f'client_id = "fed-auc-dashboard"\nredirect_uri = '
            f'"http://127.0.0.1:{port}/oauth2callback"\n'
        )
        monkeypatch.setenv("FED_AUC_OIDC_CLIENT_SECRET", "not-a-real-secret")
        process, url = start_dashboard(
            tmp_path / "runs", port, options=["--config", str(tmp_path / "dashboard.toml")]
        )
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                _check_roles(browser, url)
                _check_refusals(browser, url, idp)
                browser.close()
        finally:
            stop(process)
    events = [(e["event"], e["user"], e["role"]) for e in audit.read(log) if e["event"] != "view"]
    assert events == [
        ("sign-in", "ana@north.example", "clinician"),
        ("sign-out", "ana@north.example", "clinician"),
        ("sign-in", "olu@north.example", "operator"),
        ("refused", "eve@north.example", None),
    ]
    assert all(e["time"] and e["page"] for e in audit.read(log))
    views = [(e["user"], e["page"], e["client"]) for e in audit.read(log) if e["event"] == "view"]
    assert views == [
        ("ana@north.example", "overview", "local"),
        ("olu@north.example", "overview", "local"),
        ("olu@north.example", "participation", "local"),
    ]
    assert all(e["run"] in RUN_IDS for e in audit.read(log) if e["event"] == "view")
    assert oct(log.stat().st_mode & 0o777) == "0o600"  # who looked at what: its user's only


def _check_roles(browser, url: str) -> None:
    context, page = _sign_in(browser, url, "ana")
    page.get_by_role("heading", name="Overview").wait_for()
    assert _nav(page) == CLINICIAN_PAGES
    page.get_by_text("Signed in as ana@north.example (clinician)").wait_for()
    page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').click()
    options = page.get_by_role("option").all_inner_texts()
    assert options and not any("run-other" in o for o in options)  # restricted to operators
    page.keyboard.press("Escape")
    page.get_by_role("button", name="Sign out").click()
    page.get_by_role("button", name="End session").click()  # the provider's sign-out page
    page.get_by_role("button", name="Sign in").wait_for()
    context.close()

    context, page = _sign_in(browser, url, "olu")
    page.get_by_role("heading", name="Overview").wait_for()
    assert _nav(page) == OPERATOR_PAGES
    page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name="Participation").click()
    page.get_by_role("heading", name="Events").wait_for()
    context.close()


def _check_refusals(browser, url: str, idp) -> None:
    context, page = _sign_in(browser, url, "eve")
    page.get_by_text("Signed in as eve@north.example").wait_for()
    page.get_by_text("not allowed to open this dashboard").wait_for()
    html = page.content()
    assert not any(run in html for run in RUN_IDS)
    assert page.locator('[data-testid="stSidebarNav"]').count() == 0
    context.close()

    for mode in ("forge", "expired"):
        idp.mode, idp.forge_email = mode, "olu@north.example"
        context, page = _sign_in(browser, url, "eve" if mode == "forge" else "olu")
        page.get_by_role("button", name="Sign in").wait_for()  # back at the door, no cookie
        assert not any(c["name"].startswith("_streamlit_user") for c in context.cookies())
        assert "Signed in as" not in page.content(), mode
        context.close()
    idp.mode = "honest"
