"""Shared test setup: one torch thread (tiny tensors; threads only add latency on 2 cores);
the dashboard under AppTest served as ``fed-auc dashboard`` serves it, on loopback."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    # the CLI's `--threads auto` and subprocesses respect it
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True, scope="session")
def _dashboard_on_loopback():
    """AppTest has no server: its ``server.address`` is Streamlit's default (every
    interface), where the app shows nothing of the store without sign-in. Tests of that
    refusal set the option themselves (``tests.support.apptest.streamlit_option``)."""
    from tests.support.apptest import streamlit_option

    with streamlit_option("server.address", "127.0.0.1"):
        yield


@pytest.fixture
def shared_dp_secret(monkeypatch):
    """Every node's DP secret set to one known value, for tests that compare two runs of the
    same experiment (in-process and over the node path, or with and without secure
    aggregation): a node's secret is otherwise its own random bytes per state directory, so
    two runs draw different noise by design. The noise still differs per site and release
    (the key names them)."""
    from pathlib import Path

    from fed_auc.privacy.accounting import SECRET_FILE, NodeSecret

    def known(self, state_dir) -> None:
        self.path = Path(state_dir) / SECRET_FILE
        self._key = b"a secret shared by the runs compared"

    monkeypatch.setattr(NodeSecret, "__init__", known)
