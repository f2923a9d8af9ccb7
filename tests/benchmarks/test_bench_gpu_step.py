"""benchmarks/systems/gpu_step.py at smoke size on the CPU: its numbers add up, and the Flower
part's site files carry the device and precision (Flower runs are e2e-tested)."""

from __future__ import annotations

import pytest

from fed_auc.site import SiteDefinition


@pytest.fixture(scope="module")
def bench():
    from benchmarks.systems import gpu_step

    return gpu_step


def test_the_smoke_run_measures_both_sides_for_every_precision(bench, tmp_path):
    out = tmp_path / "gpu_step.md"
    result = bench.main(
        ["--smoke", "--device", "cpu", "--no-flower", "--rounds", "2", "--markdown", str(out)]
    )
    steps = result["steps"]
    assert [r["precision"] for r in steps] == ["fp32", "bf16"]
    text = out.read_text()
    for r in steps:
        assert r["device"] == "cpu" and r["node"] > 0 and r["plain"] > 0
        lo, hi = r["ratio_range"]
        assert lo <= r["time_ratio"] <= hi
        assert r["device_peak_mib"] is None  # CUDA only
        row = f"| {r['precision']} | cpu | {r['node']:.1f} | {r['plain']:.1f} | "
        assert row + f"{r['time_ratio']:.2f} ({lo:.2f}–{hi:.2f}) | — |" in text
    assert result["flower"] is None and "Flower" not in text


def test_the_flower_sites_compute_where_the_benchmark_asks(tmp_path):
    from benchmarks.systems import flower_overhead

    node = {"device": "cpu", "precision": "bf16"}
    files = flower_overhead.site_files(tmp_path, 0.15, node)
    assert len(files) == 3
    for path in files:
        site = SiteDefinition.from_toml(path)
        assert (site.device, site.precision) == ("cpu", "bf16")
        assert site.compute().precision == "bf16"
