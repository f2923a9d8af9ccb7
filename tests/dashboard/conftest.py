"""Dashboard tests run the app as ``fed-auc dashboard`` serves it: on a loopback address (the
app refuses to show the store unauthenticated anywhere else)."""

import pytest

from tests.support.apptest import streamlit_option


@pytest.fixture(autouse=True)
def served_on_loopback():
    with streamlit_option("server.address", "127.0.0.1"):
        yield
