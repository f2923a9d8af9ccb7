"""ONNX export (``model.onnx``): the scoring module as an ONNX graph with a dynamic batch axis,
checked with onnxruntime against ``fed-auc evaluate``'s scores before it is written; the
card and deployment facts (and the check's max difference) in its ``metadata_props``.

torch 2.13's default ``torch.onnx.export`` path (dynamo) needs ``onnxscript``, which fed-auc
does not depend on; the TorchScript-based exporter (``dynamo=False``) needs only ``onnx`` and
gives the same graph for this fixed-size CNN. Its deprecation warning is torch's, not the
user's, so it is silenced here.
"""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fed_auc.registry.deploy import DEPLOY_FILE, Source, check_images
from fed_auc.registry.torchscript import reference_scores

ONNX_FILE = "model.onnx"
ONNX_TOLERANCE = 1e-4  # max |score difference| onnxruntime vs fed-auc evaluate
OPSET = 17
INPUT, OUTPUT = "image", "score"


def require_onnx() -> None:
    """onnx and onnxruntime, or a one-line reason how to get them."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        raise ValueError(
            f"ONNX export needs onnx and onnxruntime ({exc}): pip install 'fed-auc[export]'"
        ) from None


def onnx_bytes(source: Source) -> bytes:
    """The scorer exported to ONNX in memory (batch axis dynamic, image side fixed)."""
    scorer = source.scorer()
    sample = check_images(source, random=2)[:2]
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # legacy-exporter and tracer warnings: shapes are fixed
        torch.onnx.export(
            scorer,
            (sample,),
            buffer,
            dynamo=False,
            input_names=[INPUT],
            output_names=[OUTPUT],
            dynamic_axes={INPUT: {0: "N"}, OUTPUT: {0: "N"}},
            opset_version=OPSET,
        )
    return buffer.getvalue()


def run_onnx(model: bytes | str | Path, images: np.ndarray) -> np.ndarray:
    """Scores of ``images`` (N, C, S, S float32 in [0, 1]) by onnxruntime on the CPU."""
    import onnxruntime as ort

    target = str(model) if isinstance(model, Path | str) else model
    session = ort.InferenceSession(target, providers=["CPUExecutionProvider"])
    return session.run([OUTPUT], {INPUT: np.ascontiguousarray(images, dtype=np.float32)})[0]


def write_onnx(
    source: Source, out_dir: Path, facts: dict[str, Any], tolerance: float = ONNX_TOLERANCE
) -> tuple[Path, float]:
    """Write ``model.onnx`` once onnxruntime's scores of the check images (all at once and
    one at a time: the batch axis is dynamic) are within ``tolerance`` of ``fed-auc
    evaluate``'s; returns the path and the max absolute difference. Refuses (ValueError)
    otherwise, writing nothing."""
    require_onnx()
    import onnx

    graph = onnx_bytes(source)
    images = check_images(source)
    expected = reference_scores(source, images)
    batch = run_onnx(graph, images.numpy())
    single = np.concatenate([run_onnx(graph, images[i : i + 1].numpy()) for i in range(2)])
    diff = max(
        float(np.max(np.abs(batch - expected))), float(np.max(np.abs(single - expected[:2])))
    )
    path = out_dir / ONNX_FILE
    if not diff <= tolerance:  # NaN too
        raise ValueError(
            f"ONNX export: onnxruntime's scores differ from fed-auc evaluate's by {diff:.3g} "
            f"(tolerance {tolerance:g}); {path} not written"
        )
    import onnxruntime

    check = {"max_abs_diff": diff, "tolerance": tolerance, "images": len(images),
             "against": "fed-auc evaluate's scores (fed_auc.tta.predict, CPU fp32)",
             "runtime": f"onnxruntime {onnxruntime.__version__}, CPUExecutionProvider"}  # fmt: skip
    facts = {**facts, "file": ONNX_FILE, "runtime": f"ONNX opset {OPSET}", "check": check,
             "io": {"input": INPUT, "output": OUTPUT}}  # fmt: skip
    model = onnx.load_from_string(graph)
    props = {
        DEPLOY_FILE: json.dumps(facts),
        "model_card.json": json.dumps(source.card),
        "max_abs_diff": repr(diff),
        "tolerance": repr(tolerance),
    }
    for key, value in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    model.doc_string = (
        f"fed-auc model {facts['training'].get('run_id')}: input {INPUT!r} (N, C, S, S) in "
        f"[0, 1], output {OUTPUT!r} per label {facts['labels']}; facts in metadata {DEPLOY_FILE}"
    )
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path, diff


def read_metadata(path: str | Path) -> dict[str, str]:
    """An ``model.onnx``'s ``metadata_props`` as a dict of strings."""
    import onnx

    return {p.key: p.value for p in onnx.load(str(path)).metadata_props}
