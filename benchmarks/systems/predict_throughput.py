"""``fed-auc predict``'s images/s against a plain loop over the same model and images.

Data (made here, in a temporary folder): N synthetic 8-bit grayscale PNGs of ``--side`` px (a
gradient, two bright ellipses, noise), and a registered model of ``--arch`` (seeded random
weights: speed does not depend on training) at the card's ``--image-size``, TTA none.

Per repeat, one after the other so both see the same machine load: predict
(``fed_auc.predict.job.run_prediction``: the folder listed, every image read by
``read_image``, scored in batches, the CSV written, the job recorded in a store; no SR) and
the plain loop (each image read by the same ``read_image``, stacked into batches of the same
size, ``sigmoid(model(batch))``, nothing written). The table gives the median images/s of
each, their ratio (predict / plain: what the CSV, the item bookkeeping and the store cost)
and the 1-minute load average before and after.

    python -m benchmarks.systems.predict_throughput --images 200 --repeats 3
    python -m benchmarks.systems.predict_throughput --images 2000 --arch densenet121 \
        --image-size 224 --markdown benchmarks/results/predict_throughput.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from benchmarks.common.fragment import emit, provenance
from fed_auc.data.images import read_image
from fed_auc.exchange import MODEL_FORMAT
from fed_auc.io import save_json, save_torch
from fed_auc.models import build_model
from fed_auc.predict.items import folder_items
from fed_auc.predict.job import run_prediction
from fed_auc.registry.load import load_registered_model
from fed_auc.tta import scoring_batch


def make_images(folder: Path, n: int, side: int, seed: int) -> list[Path]:
    """N chest-film-like PNGs (distinct files, so every read decodes)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:side, 0:side] / side
    paths = []
    for i in range(n):
        film = 60 + 80 * y
        for cx in (0.33, 0.67):
            film += 70 * (((x - cx) / 0.15) ** 2 + ((y - 0.5) / 0.3) ** 2 < 1)
        film += rng.normal(0, 12, film.shape)
        path = folder / f"{i // 100:03d}" / f"{i:06d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(film, 0, 255).astype(np.uint8)).save(path)
        paths.append(path)
    return paths


def make_model(folder: Path, arch: str, size: int, seed: int) -> Path:
    torch.manual_seed(seed)
    model = build_model(arch, 1).eval()
    folder.mkdir(parents=True, exist_ok=True)
    card = {"run_id": "bench", "label_names": ["finding"], "positive_class": ["finding"],
            "image_size": size, "tta": "none", "threshold": [0.5]}  # fmt: skip
    blob = {"format": MODEL_FORMAT, "model_config": model.config(),
            "state_dict": model.state_dict(), "auc": {}, "label_names": ["finding"],
            "positive_class": ["finding"], "image_size": size}  # fmt: skip
    save_torch(blob, folder / "model.pt")
    save_json(card, folder / "model_card.json")
    return folder


@torch.no_grad()
def plain_loop(model: torch.nn.Module, paths: list[Path], size: int, batch: int) -> None:
    """Read each image, forward full batches: the least a scorer can do."""
    for start in range(0, len(paths), batch):
        images = torch.stack([read_image(p, size) for p in paths[start : start + batch]])
        torch.sigmoid(model(images))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--side", type=int, default=256, help="stored image side, px")
    parser.add_argument("--arch", default="tiny")
    parser.add_argument("--image-size", type=int, default=64, help="the card's image size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    begun = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="predict-bench-") as tmp:
        root = Path(tmp)
        paths = make_images(root / "images", args.images, args.side, args.seed)
        model_dir = make_model(root / "model", args.arch, args.image_size, args.seed)
        model, _ = load_registered_model(model_dir)
        batch = scoring_batch(torch.empty(0, 1, args.image_size, args.image_size))
        load_before = os.getloadavg()[0]
        rates: dict[str, list[float]] = {"predict": [], "plain": []}
        plain_loop(model, paths[:batch], args.image_size, batch)  # warm-up: page cache, torch
        for _ in range(args.repeats):
            start = time.perf_counter()
            run_prediction(model_dir, folder_items(root / "images"), root / "p.csv", root / "runs")
            rates["predict"].append(len(paths) / (time.perf_counter() - start))
            start = time.perf_counter()
            plain_loop(model, paths, args.image_size, batch)
            rates["plain"].append(len(paths) / (time.perf_counter() - start))
        load_after = os.getloadavg()[0]
    predict, plain = (statistics.median(rates[k]) for k in ("predict", "plain"))
    settings = (f"{args.images} PNGs of {args.side} px, {args.arch} at {args.image_size} px, "
                f"batch {batch}, {args.threads} thread(s), median of {args.repeats}")  # fmt: skip
    table = "\n".join([
        provenance(str(args.seed), time.perf_counter() - begun, settings),
        "",
        "| images | arch @ px | predict img/s | plain loop img/s | predict / plain "
        "| load avg before → after |",
        "|---|---|---|---|---|---|",
        f"| {args.images} | {args.arch} @ {args.image_size} | {predict:.1f} | {plain:.1f} "
        f"| {predict / plain:.2f} | {load_before:.2f} → {load_after:.2f} |",
        "",
        f"all repeats, predict: {[round(r, 1) for r in rates['predict']]}; plain: "
        f"{[round(r, 1) for r in rates['plain']]}",
    ])  # fmt: skip
    emit(table, args.markdown)


if __name__ == "__main__":
    main()
