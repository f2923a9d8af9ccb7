"""benchmarks/systems/pacs_fetch.py at toy size: the three ways of getting the same images
from a real Orthanc run and each counts every image."""

from __future__ import annotations

from benchmarks.common.orthanc import PASSWORD, PASSWORD_ENV
from benchmarks.systems import pacs_fetch


def test_toy_run_measures_plain_fetch_and_again(monkeypatch, capsys):
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    (row,) = pacs_fetch.table(images=8, sizes=[32])
    assert row["images"] == 10 and row["size"] == 32  # 8 patients, 2 of them with two images
    assert min(row["plain_per_s"], row["fetch_per_s"], row["again_per_s"]) > 0
