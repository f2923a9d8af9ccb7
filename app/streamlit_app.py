"""Entry point of the dashboard: ``fed-auc dashboard`` (or ``streamlit run app/streamlit_app.py
--server.address 127.0.0.1``: without sign-in the app shows the store on loopback only).

The runs directory comes from the environment variable FED_AUC_RUNS_DIR (default ``runs``).
The run picker lives in the sidebar, so every page shows the same run. With sign-in on
(``fed-auc dashboard --auth oidc``), nobody gets past ``gate.admit`` unless the access file
names them, and the navigation holds only the pages of their role.
"""

import sys
from pathlib import Path

# Streamlit puts only this folder on sys.path; the pages import ``app.*`` from the repo root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import streamlit as st  # noqa: E402

from app import common, gate  # noqa: E402
from app.pages import DEFAULT_PAGE, pages_of  # noqa: E402

st.set_page_config(page_title="fed-auc dashboard", layout="wide")
viewer = gate.admit()
allowed = {
    p.key: st.Page(p.file, title=p.title, default=p == DEFAULT_PAGE) for p in pages_of(viewer.role)
}
page = st.navigation(list(allowed.values()))
page_key = next(k for k, p in allowed.items() if p == page)
gate.record_sign_in(viewer, page_key)
gate.sidebar(viewer)
common.run_picker()
gate.record_view(viewer, page_key, st.session_state.get(common.RUN_KEY))
page.run()
