"""Thread selection: idle cores from the load average, explicit counts, clear errors."""

from __future__ import annotations

import pytest
import torch

from fed_auc import cli
from fed_auc.threads import apply_threads, auto_threads, parse_threads


@pytest.mark.parametrize(
    ("cpus", "load", "expected"),
    [(2, 0.2, 2), (2, 0.6, 1), (2, 5.3, 1), (16, 3.4, 13), (16, 0.0, 16), (1, 0.0, 1)],
)
def test_auto_threads_takes_the_idle_cores(cpus: int, load: float, expected: int) -> None:
    assert auto_threads(cpus, load) == expected


def test_parse_threads() -> None:
    assert parse_threads("auto") is None
    assert parse_threads("3") == 3
    for bad in ("0", "-1", "two", "1.5"):
        message = f"--threads must be 'auto' or an integer >= 1, got '{bad}'"
        with pytest.raises(ValueError, match=message):
            parse_threads(bad)


def test_apply_threads_sets_torch_and_respects_the_operator(monkeypatch) -> None:
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        assert apply_threads(1) == 1 and torch.get_num_threads() == 1
        assert apply_threads(None) == 1  # OMP_NUM_THREADS is now set: kept as chosen
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert apply_threads(None) == auto_threads() == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_cli_rejects_a_bad_thread_count(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--threads", "0", "runs"])
    assert "--threads must be 'auto' or an integer >= 1, got '0'" in capsys.readouterr().err
