"""benchmarks/systems/predict_throughput.py at toy size: it runs and writes its table, and the
plain loop it compares with reads the same images predict scores."""

from __future__ import annotations

from benchmarks.systems import predict_throughput


def test_toy_run_writes_the_side_by_side_table(tmp_path):
    out = tmp_path / "predict.md"
    predict_throughput.main(["--images", "6", "--side", "24", "--image-size", "16",
                             "--repeats", "1", "--markdown", str(out)])  # fmt: skip
    text = out.read_text()
    assert "| images | arch @ px | predict img/s | plain loop img/s | predict / plain" in text
    assert "| 6 | tiny @ 16 |" in text
    assert len(list(predict_throughput.make_images(tmp_path / "x", 3, 24, 0))) == 3
