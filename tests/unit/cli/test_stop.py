"""A stop the operator asks for (Ctrl-C, SIGTERM) is never lost, even when Python swallows it."""

from __future__ import annotations

import signal

import pytest

import fed_auc.simulation
from fed_auc.cli import main
from fed_auc.store.records import RoundRecord


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the point
def test_a_stop_swallowed_by_a_finalizer_stops_the_run_at_the_next_round(
    tmp_path, monkeypatch, capsys
):
    """Python prints and drops an exception raised in ``__del__``: a SIGTERM whose handler
    runs there must still stop ``fed-auc simulate`` (exit 130), at the next round."""
    rounds_seen = []

    class Finalizer:
        def __del__(self) -> None:  # the signal lands while a finalizer runs
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)

    def run_simulation(config, on_round, on_run=None, on_warmup_round=None):
        Finalizer()  # collected at once: its KeyboardInterrupt is swallowed
        for round_ in range(1, 4):
            rounds_seen.append(round_)
            on_round(RoundRecord(round=round_))
        return {}

    monkeypatch.setattr(fed_auc.simulation, "run_simulation", run_simulation)
    config = tmp_path / "small.toml"
    config.write_text("sites = 2\nrounds = 3\n")
    before = signal.getsignal(signal.SIGTERM)
    assert main(["simulate", "--config", str(config), "--runs-dir", str(tmp_path)]) == 130
    assert rounds_seen == [1]  # stopped after the first round, not at the end
    assert "stopped" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back
