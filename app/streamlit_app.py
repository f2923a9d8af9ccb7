"""Entry point of the dashboard: ``streamlit run app/streamlit_app.py`` (or ``fed-auc dashboard``).

The runs directory comes from the environment variable FED_AUC_RUNS_DIR (default ``runs``).
The run picker lives in the sidebar, so every page shows the same run.
"""

import sys
from pathlib import Path

# Streamlit puts only this folder on sys.path; the pages import ``app.*`` from the repo root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import streamlit as st  # noqa: E402

from app import common  # noqa: E402

st.set_page_config(page_title="fed-auc dashboard", layout="wide")
PAGES = [
    st.Page("views/overview.py", title="Overview", default=True),
    st.Page("views/sites.py", title="Sites"),
    st.Page("views/heterogeneity.py", title="Heterogeneity"),
    st.Page("views/participation.py", title="Participation"),
    st.Page("views/compare.py", title="Compare"),
    st.Page("views/roc.py", title="ROC"),
    st.Page("views/operating_point.py", title="Operating point"),
    st.Page("views/evaluations.py", title="Evaluations"),
]
page = st.navigation(PAGES)
common.run_picker()
page.run()
