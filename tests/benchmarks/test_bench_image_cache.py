"""benchmarks/systems/image_cache.py's verify mode at toy size: every number it reports is
measured and lands in its table."""

from __future__ import annotations

from benchmarks.systems import cache_verify, image_cache


def test_verify_mode_measures_hashing_reading_and_paths(tmp_path):
    result = cache_verify.measure(tmp_path, images=300, sizes=[8, 16], megabytes=2, batches=3)
    assert set(result["rates"]) == {"sha256", "blake2b"} and min(result["rates"].values()) > 0
    assert [r["size"] for r in result["verify"]] == [8, 16]
    assert result["verify"][1]["gb"] == 300 * 16 * 16 / 1e9
    assert result["read"]["preadv"] > 0 and result["paths_s"] > 0
    assert not list(tmp_path.glob("verify-*"))  # the cache files it wrote are gone
    text = cache_verify.markdown(result, image_cache._table_head(1.0, cache_verify.COLUMNS))
    assert "| 300 | 16 | 0.00 |" in text and "Containing 300 CSV image paths" in text
