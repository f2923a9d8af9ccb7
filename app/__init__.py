"""The Streamlit dashboard over the run store (read-only). Entry point: streamlit_app.py."""
