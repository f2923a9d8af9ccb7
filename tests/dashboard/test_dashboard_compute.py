"""The Participation page shows each site's compute per round, as the store holds it."""

from __future__ import annotations

import pytest

from fed_auc.store.records import RoundRecord, SiteRound
from fed_auc.store.run_store import RunStore
from tests.support.apptest import open_page, texts

COMPUTE = {  # site -> per round (device, images/s, host peak MiB, device peak MiB)
    "north": [("cuda:0", 410.0, 2100.0, 5120.0), ("cuda:0", 430.0, 2150.0, 5200.0)],
    "south": [("cpu", 5.5, 1300.0, None), ("cpu", 4.5, 1350.0, None)],
}


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs")
    with RunStore(path) as store:
        run = store.create_run("codasca", {"rounds": 2}, run_id="run-compute")
        store.record_round(run, RoundRecord(0, sites=[SiteRound(s, "initial") for s in COMPUTE]))
        for round_ in (1, 2):
            rows = []
            for site, rounds in COMPUTE.items():
                device, rate, host, peak = rounds[round_ - 1]
                compute = {"device": device, "precision": "bf16", "images_per_s": rate,
                           "host_peak_mib": host}  # fmt: skip
                if peak is not None:
                    compute["device_peak_mib"] = peak
                rows.append(SiteRound(site, "completed", steps=8, metrics={"compute": compute}))
            store.record_round(run, RoundRecord(round_, sites=rows))
        store.finish_run(run, "completed", {})
        bare = store.create_run("codasca", {"rounds": 1}, run_id="run-bare")
        store.record_round(bare, RoundRecord(0, sites=[SiteRound("north", "initial")]))
        store.record_round(bare, RoundRecord(1, sites=[SiteRound("north", "completed")]))
        store.finish_run(bare, "completed", {})
    return path


def test_participation_shows_device_throughput_and_memory_per_site_and_round(
    monkeypatch, store_dir
):
    at = open_page(monkeypatch, store_dir, "participation", "run-compute")
    table = at.dataframe[-1].value
    assert len(table) == 4
    for site, rounds in COMPUTE.items():
        for round_, (device, rate, host, peak) in enumerate(rounds, start=1):
            row = table[(table["site"] == site) & (table["round"] == str(round_))].iloc[0]
            assert (row["device"], row["precision"]) == (device, "bf16")
            assert (row["images/s"], row["host peak MiB"]) == (f"{rate:.1f}", f"{host:.0f}")
            shown = row["device peak MiB"]
            assert shown == (f"{peak:.0f}" if peak is not None else "—")  # not on CUDA
    assert "Slowest site: south (5.0 images/s median, on cpu)" in texts(at)


def test_a_run_without_compute_says_so(monkeypatch, store_dir):
    at = open_page(monkeypatch, store_dir, "participation", "run-bare")
    assert "No compute recorded" in texts(at)
