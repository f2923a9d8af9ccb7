"""A transport is what ``fed_auc.exchange.Transport`` declares, and nothing a newcomer must learn
from another implementation: both transports (and the test stand-in for Flower) provide every
member of the protocol, each method with the protocol's parameters."""

from __future__ import annotations

import inspect

import pytest

from fed_auc.exchange import Transport
from fed_auc.simulation import InProcessSites
from fed_auc.transport.flower.transport import FlowerTransport
from tests.support.flower_like import FlowerLikeTransport

MEMBERS = {name: member for name, member in vars(Transport).items() if not name.startswith("_")}


def test_the_protocol_declares_what_the_run_frame_asks_of_a_transport():
    assert set(MEMBERS) == {
        "sites", "summaries", "use", "register", "train", "secure", "evaluate", "report",
        "compare", "end",
    }  # fmt: skip


@pytest.mark.parametrize("transport", [InProcessSites, FlowerTransport, FlowerLikeTransport])
def test_each_transport_provides_every_member_with_the_protocol_s_parameters(transport):
    init = inspect.getsource(transport.__init__)
    for name, declared in MEMBERS.items():
        if isinstance(declared, property):
            assert hasattr(transport, name) or f"self.{name}" in init, (transport, name)
            continue
        provided = getattr(transport, name, None)
        assert callable(provided), (transport, name)
        expected = list(inspect.signature(declared).parameters)
        assert list(inspect.signature(provided).parameters) == expected, (transport, name)
