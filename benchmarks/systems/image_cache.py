"""Hospital scale: a node's memory and training speed with its images in the on-disk cache.

Data (made once, outside the repository, under ``--data``): CSV sites of N synthetic 320-px
PNG chest-film-like images (a bright ellipse pair on a gradient, noise), N in {1k, 10k,
100k}. The first 2,000 images are distinct files; the rows beyond them are hard links to
those files under their own names, so the node opens, decodes and caches every row as a
separate image (memory and time are as for distinct files) without writing 100,000 PNGs.
Each site has a split column: 200 validation and 200 test rows, the rest training.

Table 1 (``rss``): peak resident memory of each command, measured as its own process
(``os.wait4``): ``fed-auc node --site S --check --image-size 224`` (builds the cache the
first time), then ``fed-auc --threads 1 simulate --site S`` for two training rounds (tiny
model unless ``--model``, 224 px, the cache already built); at 1k also the in-memory path the
cache replaced, and the node that scored 256 images at a time whatever their size.

Table 2 (``throughput``): images/s at 224 px, one thread, of a node's local training
(``Node.train``, codasca) through the cache and of a plain PyTorch loop (the same model, loss
and optimizer) over a ``DataLoader`` of the same memmap, rounds interleaved.

    python -m benchmarks.systems.image_cache generate --data /work/bench-data --sizes 1000 10000
    python -m benchmarks.systems.image_cache rss --data /work/bench-data --sizes 1000 10000
    python -m benchmarks.systems.image_cache throughput --data /work/bench-data
    python -m benchmarks.systems.image_cache verify --data /work/bench-data --sizes 100000

Table 3 (``verify``): what checking the cache costs at N images (the first ``--sizes``):
SHA-256 verification at 28, 128 and 224 px against BLAKE2b, batch reads through the
identity check, path containment (``benchmarks.systems.cache_verify``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from benchmarks.common.fragment import command_line, emit
from benchmarks.common.machine import describe
from benchmarks.common.paths import ROOT
from benchmarks.systems import cache_verify
from benchmarks.systems.overhead import PlainLoop
from fed_auc.algorithms import build_backend
from fed_auc.data.cache import CACHE_FOLDER, MANIFEST
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.node.node import LocalTraining, Node
from fed_auc.site import SiteDefinition

DISTINCT = 2_000  # distinct PNG files; rows beyond are hard links under their own names
SIDE = 320
HELD_OUT = 200  # validation rows, and as many test rows
IMAGE_SIZE = 224
IN_MEMORY = (  # the node as it was: no cache, every image a float32 tensor in memory
    "import sys; import fed_auc.site as s; "
    "s.SiteDefinition.cache_dir = property(lambda self: None); "
    "from fed_auc.cli import main; sys.exit(main(sys.argv[1:]))"
)
WHOLE_CHUNKS = (  # the node as it was: scoring 256 images at a time whatever their size
    "import sys; import fed_auc.tta as t; t.SCORING_PIXELS = 256 * 224 * 224; "
    "from fed_auc.cli import main; sys.exit(main(sys.argv[1:]))"
)


def film(rng: np.random.Generator, positive: bool) -> np.ndarray:
    """A 320-px grayscale image: gradient, two 'lungs', a brighter heart when positive."""
    y, x = np.mgrid[0:SIDE, 0:SIDE] / SIDE
    image = 60 + 40 * y + rng.normal(0, 6, (SIDE, SIDE))
    for cx in (0.32, 0.68):
        lung = ((x - cx) / 0.17) ** 2 + ((y - 0.5) / 0.3) ** 2 < 1
        image[lung] += 70 + rng.normal(0, 10)
    heart = ((x - 0.52) / (0.14 if positive else 0.1)) ** 2 + ((y - 0.62) / 0.12) ** 2 < 1
    image[heart] += 50
    return np.clip(image, 0, 255).astype(np.uint8)


def generate(data: Path, n: int) -> Path:
    """The site of ``n`` rows under ``data/n{n}`` (distinct images made once under
    ``data/distinct``); returns its site file."""
    distinct = data / "distinct"
    distinct.mkdir(parents=True, exist_ok=True)
    for i in range(min(n, DISTINCT)):
        path = distinct / f"{i:05d}.png"
        if not path.exists():
            rng = np.random.default_rng(i)
            Image.fromarray(film(rng, i % 5 == 0)).save(path)
    site = data / f"n{n}"
    (site / "img").mkdir(parents=True, exist_ok=True)
    lines = ["Path,label,patient_id,split"]
    for i in range(n):
        link = site / "img" / f"{i:06d}.png"
        if not link.exists():
            os.link(distinct / f"{i % DISTINCT:05d}.png", link)
        split = "val" if i < HELD_OUT else "test" if i < 2 * HELD_OUT else "train"
        lines.append(f"img/{i:06d}.png,{int(i % DISTINCT % 5 == 0)},p{i},{split}")
    (site / "labels.csv").write_text("\n".join(lines) + "\n")
    toml = site / "site.toml"
    toml.write_text(
        f'name = "n{n}"\n[data]\nspec = "csv:labels.csv"\n[node]\nstate_dir = "state"\n'
    )
    return toml


def peak(command: list[str]) -> dict:
    """Peak RSS (MiB) and wall time of ``command`` run as its own process."""
    start = time.perf_counter()
    with open(os.devnull, "w") as quiet:
        process = subprocess.Popen(command, cwd=ROOT, stdout=quiet, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(process.pid, 0)
        error = process.stderr.read().decode()[-2000:]
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise RuntimeError(f"{command} failed ({process.returncode}): {error}")
    return {"rss_mib": usage.ru_maxrss / 1024, "seconds": time.perf_counter() - start}


def rss_rows(data: Path, sizes: list[int], model: str = "tiny") -> list[dict]:
    """Table 1: --check and two training rounds of ``model`` per N; at 1k also the in-memory
    node the cache replaced and the node that scored 256 images at a time at any size."""
    rows = []
    for n in sizes:
        site = generate(data, n)
        check = ["node", "--site", str(site), "--check", "--image-size", str(IMAGE_SIZE)]
        with tempfile.TemporaryDirectory() as runs:
            train = [
                "--threads", "1", "simulate", "--site", str(site), "--rounds", "2",
                "--local-steps", "2", "--batch-size", "16", "--model", model,
                "--image-size", str(IMAGE_SIZE), "--runs-dir", runs, "--json",
            ]  # fmt: skip
            cli = [sys.executable, "-m", "fed_auc.cli"]
            rows.append({"n": n, "path": "cache", "check": peak(cli + check),
                         "train": peak(cli + train)})  # fmt: skip
            if n <= 1000:
                old = [sys.executable, "-c", IN_MEMORY]
                rows.append({"n": n, "path": "in memory (before)", "check": peak(old + check),
                             "train": peak(old + train)})  # fmt: skip
                whole = [sys.executable, "-c", WHOLE_CHUNKS]
                rows.append({"n": n, "path": "cache, 256-image scoring chunks (before)",
                             "check": peak(whole + check),
                             "train": peak(whole + train)})  # fmt: skip
        manifest = json.loads((site.parent / "state" / CACHE_FOLDER / MANIFEST).read_text())
        cached = next(r for r in reversed(rows) if r["n"] == n and r["path"] == "cache")
        cached["cache_mib"] = (
            site.parent / "state" / CACHE_FOLDER / manifest["file"]
        ).stat().st_size / 2**20
    return rows


class MemmapRows(Dataset):
    """The plain baseline's dataset: rows of the cache's .npy through ``np.load(mmap_mode)``,
    as float32 in [0, 1], with their labels."""

    def __init__(self, path: Path, rows: np.ndarray, labels: torch.Tensor) -> None:
        self.path, self.rows, self.labels = path, rows, labels
        self.array: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.array is None:
            self.array = np.load(self.path, mmap_mode="r")
        image = torch.from_numpy(np.array(self.array[self.rows[i]])).float().div_(255.0)
        return image, self.labels[i]


def throughput(data: Path, model: str, batch: int, steps: int, rounds: int) -> dict:
    """Images/s of Node.train through the cache and of the plain DataLoader loop, alternating
    rounds of ``steps`` steps after one warm-up round each."""
    site_file = generate(data, 1000)
    site = SiteDefinition.from_toml(site_file).load(IMAGE_SIZE)
    train = site.train
    config = ExperimentConfig(model=model, image_size=IMAGE_SIZE, batch_size=batch,
                              local_steps=steps, loss="auc_margin")  # fmt: skip
    p = train.positives()[0] / len(train)
    plain = PlainLoop(config, train, [p])  # its model, loss and optimizer; batches below
    rows = np.arange(len(train)) if train.images.rows is None else train.images.rows
    dataset = MemmapRows(train.images.path, rows, train.labels)
    loader = DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=2, drop_last=True,
                        persistent_workers=True, multiprocessing_context="forkserver")  # fmt: skip
    batches = iter(_forever(loader))
    plain.batches = ((x, y, None) for x, y in batches)
    backend = build_backend("codasca", local_steps=steps, seed=0)
    node_rates, plain_rates = [], []
    with tempfile.TemporaryDirectory() as state_dir:
        training = LocalTraining(plain.model.config(), "auc_margin", batch_size=batch)
        node = Node(site, backend, training, state_dir)
        state = backend.init_server(node.trainable, {site.name: len(train)})
        for round_ in range(rounds + 1):
            broadcast = backend.plan(state, round_)
            broadcast.config["pos_ratio"] = [p]
            start = time.perf_counter()
            reply = node.train(broadcast)
            node_s = time.perf_counter() - start
            state = backend.aggregate(state, [backend.complete_reply(reply, broadcast)])
            start = time.perf_counter()
            plain.steps(steps)
            plain_s = time.perf_counter() - start
            if round_ > 0:
                node_rates.append(steps * batch / node_s)
                plain_rates.append(steps * batch / plain_s)
    ratios = [n / q for n, q in zip(node_rates, plain_rates, strict=True)]
    return {"model": model, "batch": batch, "steps": steps, "node": node_rates,
            "plain": plain_rates, "ratio": ratios, "load": os.getloadavg()[0]}  # fmt: skip


def _forever(loader: DataLoader):
    while True:
        yield from loader


def _spread(values: list[float], digits: int = 1) -> str:
    mid, low, high = statistics.median(values), min(values), max(values)
    return f"{mid:.{digits}f} ({low:.{digits}f}–{high:.{digits}f})"


def _table_head(elapsed: float, columns: list[str]) -> list[str]:
    """The provenance line (command, wall time, machine) and a Markdown table's header."""
    return [
        f"`{command_line()}` ({elapsed:.0f} s; {describe()})",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]


def rss_markdown(rows: list[dict], elapsed: float) -> str:
    lines = _table_head(elapsed, [
        "N images", "path", "--check peak RSS (MiB)", "--check time (s)",
        "2 rounds peak RSS (MiB)", "2 rounds time (s)", "cache on disk (MiB)",
    ])  # fmt: skip
    for r in rows:
        cache = f"{r['cache_mib']:.0f}" if "cache_mib" in r else "–"
        lines.append(
            f"| {r['n']:,} | {r['path']} | {r['check']['rss_mib']:.0f} | "
            f"{r['check']['seconds']:.0f} | {r['train']['rss_mib']:.0f} | "
            f"{r['train']['seconds']:.0f} | {cache} |"
        )
    cached = [r for r in rows if r["path"] == "cache"]
    if len(cached) > 1:
        first, last = cached[0], cached[-1]
        for what in ("check", "train"):
            ratio = last[what]["rss_mib"] / first[what]["rss_mib"]
            lines.append(f"\nRSS({last['n']:,}) / RSS({first['n']:,}), {what}: {ratio:.3f}")
    return "\n".join(lines) + "\n"


def throughput_markdown(results: list[dict], elapsed: float) -> str:
    lines = _table_head(elapsed, [
        "model", "batch", "steps/round", "node img/s (cache)", "plain DataLoader img/s",
        "node / plain", "load (1 min) at end",
    ])  # fmt: skip
    for r in results:
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['steps']} | {_spread(r['node'], 2)} | "
            f"{_spread(r['plain'], 2)} | {_spread(r['ratio'], 3)} | {r['load']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("generate", "rss", "throughput", "verify"))
    parser.add_argument("--data", type=Path, required=True, help="outside the repository")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (throughput)")
    parser.add_argument("--model", default="tiny", help="the network trained (rss)")
    parser.add_argument("--pixels", type=int, nargs="+", default=[28, 128, 224],
                        help="image sizes (verify)")  # fmt: skip
    parser.add_argument("--markdown", type=Path, help="write the result table here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    if args.what == "generate":
        for n in args.sizes:
            print(generate(args.data, n))
        return
    if args.what == "rss":
        text = rss_markdown(
            rss_rows(args.data, args.sizes, args.model), time.perf_counter() - start
        )
    elif args.what == "verify":
        result = cache_verify.measure(args.data, args.sizes[0], args.pixels, 512, 200)
        head = _table_head(time.perf_counter() - start, cache_verify.COLUMNS)
        text = cache_verify.markdown(result, head)
    else:
        results = [
            throughput(args.data, "small", 32, 4, args.rounds),
            throughput(args.data, "densenet121", 8, 2, args.rounds),
        ]
        text = throughput_markdown(results, time.perf_counter() - start)
    emit(text, args.markdown)


if __name__ == "__main__":
    main()
