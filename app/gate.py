"""The door of the dashboard: who is signed in (Streamlit's OpenID Connect login, ``st.user``),
what the access file lets them open, and the audit log of every sign-in, refusal, sign-out and
run viewed. Before any of it, a request under a host name the dashboard was not started for
(a DNS-rebinding page that points its own name at 127.0.0.1) is refused.

Sign-in is on when FED_AUC_ACCESS_FILE names an access file (``fed-auc dashboard --auth oidc``
sets it, with the provider in a per-launch secrets file); without it the dashboard is the
unauthenticated one that ``fed-auc dashboard`` binds to loopback only.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlparse

import pandas as pd
import streamlit as st

from app import access, audit
from app.access import (
    ALLOWED_HOSTS_ENV,
    LOOPBACK_NAMES,
    Access,
    AccessFileError,
    Role,
    is_loopback,
    lineage,
)
from app.pages import DEFAULT_PAGE

ACCESS_FILE_ENV = "FED_AUC_ACCESS_FILE"
INSECURE_PUBLIC_ENV = "FED_AUC_INSECURE_PUBLIC"  # set by ``fed-auc dashboard --insecure-public``


@dataclass(frozen=True)
class Viewer:
    """Who is looking: ``user`` is None when sign-in is off (everything is shown)."""

    user: dict[str, Any] | None
    role: Role
    access: Access | None

    @property
    def name(self) -> str:
        return _name(self.user) if self.user is not None else "unauthenticated"

    def sees(
        self,
        run_id: str,
        config: dict[str, Any] | None,
        sources: dict[str, dict[str, Any] | None] | None = None,
    ) -> bool:
        if self.access is None or self.user is None:
            return True
        return self.access.sees_run(self.user, run_id, config, sources)


def sign_in_required() -> bool:
    return bool(os.environ.get(ACCESS_FILE_ENV))


@st.cache_resource(show_spinner=False)
def _access(path: str, version: float) -> Access:
    return access.load(path)


def _load_access() -> Access:
    """The access file, re-read whenever it changes (edits apply without a restart). One
    that has become unreadable or wrong shuts everyone out until it is fixed."""
    path = Path(os.environ[ACCESS_FILE_ENV])
    try:
        return _access(str(path), path.stat().st_mtime_ns)
    except (OSError, AccessFileError) as e:
        st.title("fed-auc dashboard")
        st.error(f"Nobody can open the dashboard until its access file is fixed: {e}")
        st.stop()


def _audit_path() -> Path:
    return Path(os.environ.get(audit.AUDIT_LOG_ENV, "dashboard-audit.log"))


def _name(user: dict[str, Any]) -> str:
    return str(user.get("email") or user.get("preferred_username") or user.get("sub") or "?")


def _requested_page() -> str:
    """The page in the address bar (``/roc`` → roc), for the audit log."""
    url = st.context.url
    path = urlparse(url).path.strip("/") if url else ""
    return path.rsplit("/", 1)[-1] or DEFAULT_PAGE.key


def current() -> Viewer | None:
    """The signed-in viewer the access file admits, else None (no UI: for queries)."""
    if not sign_in_required():
        return Viewer(None, "operator", None)
    if not st.user.is_logged_in:
        return None
    rules = _load_access()
    user = st.user.to_dict()
    role = rules.role_of(user)
    if role is None or _expired(rules, user):
        return None
    return Viewer(user, role, rules)


def _expired(rules: Access, user: dict[str, Any]) -> bool:
    """Streamlit keeps its login cookie for 30 days; a sign-in older than the access file's
    ``max_session_hours`` (counted from the ID token's ``iat``) must be renewed."""
    issued = user.get("iat")
    return not isinstance(issued, int | float) or time.time() - issued > rules.max_session_s


def allowed_hosts() -> list[str]:
    """The host names to answer: those ``fed-auc dashboard`` was started for, else Streamlit's
    ``server.allowedHosts``, else loopback's and the address it listens on."""
    if os.environ.get(ALLOWED_HOSTS_ENV):
        return os.environ[ALLOWED_HOSTS_ENV].split(",")
    if st.get_option("server.allowedHosts"):
        return list(st.get_option("server.allowedHosts"))
    address = st.get_option("server.address")
    return [*LOOPBACK_NAMES, *([address] if address not in (None, "", "0.0.0.0", "::") else [])]


def _refuse_foreign_host() -> None:
    """Streamlit refuses a websocket under another Host when ``server.allowedHosts`` is set
    (``fed-auc dashboard`` sets it); this holds the app to the same rule when it is not, e.g.
    under ``streamlit run`` by hand. A session with no request headers at all has no browser
    behind it (Streamlit's AppTest) and no Host to check."""
    headers = st.context.headers
    if not headers or access.host_allowed(headers.get("Host"), allowed_hosts()):
        return
    st.title("fed-auc dashboard")
    st.error(
        f"This dashboard does not answer the host name {headers.get('Host')!r}. Open it under "
        "one it was started for (fed-auc dashboard --allowed-host NAME adds one)."
    )
    st.stop()


def admit() -> Viewer:
    """The viewer, or a sign-in / refusal page and ``st.stop()``: nothing of the store is
    read under a foreign host name, nor before someone the access file names is signed in."""
    _refuse_foreign_host()
    if not sign_in_required():
        _refuse_open_bind()
        return Viewer(None, "operator", None)
    if not st.user.is_logged_in:
        st.title("fed-auc dashboard")
        st.write("Sign in with your hospital account to see the federation's results.")
        st.button("Sign in", type="primary", on_click=st.login)
        st.stop()
    rules = _load_access()
    user = st.user.to_dict()
    role = rules.role_of(user)
    if role is None:
        _refuse(user, "refused", "You are signed in but not allowed to open this dashboard.")
    if _expired(rules, user):
        _refuse(user, "expired", "Your sign-in has expired: sign out, then sign in again.")
    return Viewer(user, role, rules)


def _refuse_open_bind() -> None:
    """Without sign-in, serve only where ``fed-auc dashboard`` would: a loopback address, or
    another one the operator chose with ``--insecure-public``. ``streamlit run`` by hand
    listens on every interface by default, and would show every run to the network."""
    address = st.get_option("server.address")
    if is_loopback(address) or os.environ.get(INSECURE_PUBLIC_ENV):
        return
    where = f"address {address}" if address else "every network interface"
    st.title("fed-auc dashboard")
    st.error(
        f"This dashboard has no sign-in and listens on {where}: anyone who reaches it would "
        "see every run. Start it with `fed-auc dashboard` (loopback only), with "
        '`fed-auc dashboard --auth oidc` (hospitals/README.md, "Who can open the '
        'dashboard"), or add `--server.address 127.0.0.1` to `streamlit run`.'
    )
    st.stop()


def _refuse(user: dict[str, Any], event: str, message: str) -> NoReturn:
    if not st.session_state.get(f"_audited_{event}"):
        audit.record(_audit_path(), event, _name(user), None, _requested_page(), client=_client())
        st.session_state[f"_audited_{event}"] = True
    st.title("fed-auc dashboard")
    st.error(
        f"Signed in as {_name(user)}. {message} Ask the federation's operator to add you "
        "to the dashboard's access file if you should."
    )
    st.button("Sign out", on_click=sign_out, args=(user, None))
    st.stop()


@st.cache_resource(show_spinner=False)
def _seen_sign_ins() -> set[tuple[str, str, Any]]:
    """ID tokens already audited as a sign-in by this server (a reload is not a new one)."""
    return set()


def record_sign_in(viewer: Viewer, page: str) -> None:
    """Audit the first page a new sign-in (a new ID token) opens."""
    if viewer.user is None:
        return
    token = (str(_audit_path()), viewer.name, viewer.user.get("iat"))
    seen = _seen_sign_ins()
    if token not in seen:
        seen.add(token)
        audit.record(_audit_path(), "sign-in", viewer.name, viewer.role, page, client=_client())


def sign_out(user: dict[str, Any], role: Role | None) -> None:
    audit.record(_audit_path(), "sign-out", _name(user), role, _requested_page(), client=_client())
    st.logout()


def _client() -> str | None:
    """The connection's address (None for a browser on this machine: Streamlit hides it;
    and without a connection, under AppTest)."""
    address = st.context.ip_address
    return address if isinstance(address, str) else None


def record_view(viewer: Viewer, page: str, run_id: str | None) -> None:
    """Audit which run a signed-in viewer opens on which page, once per change in a session
    (a rerun that shows the same run on the same page is not a new view)."""
    if viewer.user is None or run_id is None:
        return
    seen = (page, run_id)
    if st.session_state.get("_audited_view") != seen:
        st.session_state["_audited_view"] = seen
        audit.record(
            _audit_path(), "view", viewer.name, viewer.role, page, run=run_id, client=_client()
        )


def sidebar(viewer: Viewer) -> None:
    if viewer.user is None:
        return
    st.sidebar.caption(f"Signed in as {viewer.name} ({viewer.role})")
    st.sidebar.button("Sign out", on_click=sign_out, args=(viewer.user, viewer.role))


def visible_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Only the runs the viewer may see (none for a viewer not admitted): a run derived from
    a hidden one (its warm-up, an evaluation job of its model, transitively) is hidden too."""
    viewer = current()
    if viewer is None:
        return runs.iloc[0:0]
    configs = dict(zip(runs["id"], runs["config"], strict=True))
    derived = dict(zip(runs["id"], runs["derived_from"], strict=True))
    keep = [
        viewer.sees(r, configs[r], {s: configs.get(s) for s in lineage(r, derived)})
        for r in runs["id"]
    ]
    return runs[keep].reset_index(drop=True)
