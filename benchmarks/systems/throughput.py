"""Training images/s of one fed-auc node vs the plain PyTorch loop, and which CPU settings help.

Table 1 (in this process): for DenseNet121 at 32, 64, 128 and 224 px, a real ``Node.train``
(codasca backend: load the broadcast, local steps, control variates, pending state written to
disk) and ``PlainLoop`` from ``benchmarks.systems.overhead`` train the same steps, interleaved
round by round. Table 2 (one subprocess per measurement, interleaved): the plain loop under
different thread settings, OpenMP wait policy, channels-last memory format and
``torch.compile`` — the OpenMP settings must be in the environment before torch loads, hence
the subprocesses.
Table 3: a small ``fed-auc simulate`` with ``--threads auto`` vs fixed counts.

    python -m benchmarks.systems.throughput --quick --markdown benchmarks/results/throughput.md
    python -m benchmarks.systems.throughput         # batch 32 at every size, torch.compile too
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
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.common.alternate import alternate_rounds
from benchmarks.common.fragment import command_line, emit
from benchmarks.common.machine import describe
from benchmarks.common.paths import ROOT
from benchmarks.systems.overhead import PlainLoop
from fed_auc.algorithms import build_backend
from fed_auc.data.synthetic import SiteProfile, make_site
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.node.node import LocalTraining, Node


@dataclass(frozen=True)
class Variant:
    """One CPU setting of the plain loop, measured in a fresh process."""

    name: str
    threads: int
    env: tuple[tuple[str, str], ...] = ()
    channels_last: bool = False
    compile: bool = False


VARIANTS = (
    Variant("1 thread", 1),
    Variant("2 threads", 2),
    Variant("2 threads, OMP_WAIT_POLICY=PASSIVE", 2, (("OMP_WAIT_POLICY", "PASSIVE"),)),
    Variant("1 thread, channels-last", 1, channels_last=True),
    Variant("1 thread, torch.compile", 1, compile=True),
)


@dataclass(frozen=True)
class Settings:
    model: str = "densenet121"
    sizes: tuple[tuple[int, int], ...] = ((32, 32), (64, 32), (128, 32), (224, 32))  # px, batch
    local_steps: int = 4  # steps per round (table 1) and timed steps per process (table 2)
    rounds: int = 5  # timed rounds per size, after one warm-up round
    variant_size: tuple[int, int] = (64, 32)
    repeats: int = 3  # processes per variant
    variants: tuple[str, ...] = tuple(v.name for v in VARIANTS)
    threads: int = 1
    seed: int = 0


QUICK = Settings(
    sizes=((32, 32), (64, 32), (128, 8), (224, 4)),
    local_steps=2,
    rounds=3,
    repeats=2,
    variants=tuple(v.name for v in VARIANTS if not v.compile),  # compiling takes minutes
)


def node_vs_plain(
    model: str, size: int, batch: int, steps: int, rounds: int, seed: int = 0
) -> dict:
    """Images/s of a node (codasca) and the plain loop, alternating, one warm-up round each."""
    config = ExperimentConfig(
        model=model, image_size=size, batch_size=batch, local_steps=steps,
        loss="auc_margin", seed=seed,
    )  # fmt: skip
    profile = SiteProfile("bench", max(4 * batch, 16), 2, 2, 0.2)
    site = make_site(profile, image_size=size, seed=seed)
    p = site.train.positives()[0] / len(site.train)
    plain = PlainLoop(config, site.train, [p])
    backend = build_backend("codasca", local_steps=steps, seed=seed)
    with tempfile.TemporaryDirectory() as state_dir:
        training = LocalTraining(plain.model.config(), "auc_margin", batch_size=batch, seed=seed)
        node = Node(site, backend, training, state_dir)
        node_rates, plain_rates, _ = alternate_rounds(
            node, backend, plain.steps, p, rounds, steps, batch
        )
    ratios = [p / n for n, p in zip(node_rates, plain_rates, strict=True)]  # time node / plain
    return {
        "size": size, "batch": batch,
        "node": node_rates, "plain": plain_rates, "time_ratio": ratios,
    }  # fmt: skip


def plain_rate(
    model: str, size: int, batch: int, steps: int, channels_last: bool, compile_: bool
) -> dict:
    """Images/s of the plain loop in this process (one warm-up step, then ``steps`` timed)."""
    config = ExperimentConfig(model=model, image_size=size, batch_size=batch, loss="auc_margin")
    site = make_site(SiteProfile("bench", max(2 * batch, 16), 2, 2, 0.2), image_size=size)
    plain = PlainLoop(config, site.train, [0.2])
    if channels_last:
        plain.model.to(memory_format=torch.channels_last)
        split = plain.batches.split
        split.images = split.images.contiguous(memory_format=torch.channels_last)
    if compile_:
        plain.model = torch.compile(plain.model)
    start = time.perf_counter()
    plain.steps(1)
    warmup_s = time.perf_counter() - start
    start = time.perf_counter()
    plain.steps(steps)
    return {"img_s": steps * batch / (time.perf_counter() - start), "warmup_s": warmup_s}


def run_variant(variant: Variant, model: str, size: int, batch: int, steps: int) -> dict:
    """``plain_rate`` in a fresh process with the variant's threads and environment."""
    env = {**os.environ, "OMP_NUM_THREADS": str(variant.threads), **dict(variant.env)}
    if not variant.env:
        env.pop("OMP_WAIT_POLICY", None)
    job = {"model": model, "size": size, "batch": batch, "steps": steps, "threads": variant.threads,
           "channels_last": variant.channels_last, "compile": variant.compile}  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", __spec__.name, "--worker", json.dumps(job)],
        env=env, cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def worker(job: dict) -> None:
    torch.set_num_threads(job["threads"])
    result = plain_rate(job["model"], job["size"], job["batch"], job["steps"], job["channels_last"],
                        job["compile"])  # fmt: skip
    print(json.dumps(result))


def variant_table(s: Settings) -> list[dict]:
    """Every chosen variant ``repeats`` times, in rotated order so load hits them alike."""
    chosen = [v for v in VARIANTS if v.name in s.variants]
    rates: dict[str, list[float]] = {v.name: [] for v in chosen}
    warmups: dict[str, list[float]] = {v.name: [] for v in chosen}
    size, batch = s.variant_size
    for rep in range(s.repeats):
        shift = rep % len(chosen)
        for v in chosen[shift:] + chosen[:shift]:
            result = run_variant(v, s.model, size, batch, s.local_steps * 2)
            rates[v.name].append(result["img_s"])
            warmups[v.name].append(result["warmup_s"])
    return [
        {"name": v.name, "img_s": rates[v.name], "warmup_s": statistics.median(warmups[v.name])}
        for v in chosen
    ]


CLI_THREADS = ("auto", "1", "2")


def cli_threads_table(s: Settings) -> list[dict]:
    """Wall time of a small ``fed-auc simulate`` per ``--threads`` value, interleaved.

    OMP_NUM_THREADS is removed so that ``auto`` decides; the run is the tiny model, 2 sites."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    times: dict[str, list[float]] = {t: [] for t in CLI_THREADS}
    for rep in range(s.repeats):
        shift = rep % len(CLI_THREADS)
        for threads in CLI_THREADS[shift:] + CLI_THREADS[:shift]:
            with tempfile.TemporaryDirectory() as runs_dir:
                command = [
                    sys.executable, "-m", "fed_auc.cli", "--threads", threads, "simulate",
                    "--model", "tiny", "--sites", "2", "--rounds", str(s.rounds),
                    "--runs-dir", runs_dir, "--seed", str(s.seed), "--json",
                ]  # fmt: skip
                start = time.perf_counter()
                subprocess.run(command, env=env, capture_output=True, check=True)
                times[threads].append(time.perf_counter() - start)
    return [{"threads": t, "wall_s": times[t]} for t in CLI_THREADS]


def _spread(values: list[float], digits: int = 1) -> str:
    mid, low, high = statistics.median(values), min(values), max(values)
    return f"{mid:.{digits}f} ({low:.{digits}f}–{high:.{digits}f})"


def machine_line(s: Settings) -> str:
    """The shared machine line plus what matters for threading here."""
    return (
        f"{describe()}; {torch.get_num_interop_threads()} interop threads, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, seed {s.seed}"
    )


def markdown(sizes: list[dict], variants: list[dict], s: Settings, command: str,
             load: list[float], cli: list[dict] | None = None) -> str:  # fmt: skip
    lines = [
        f"## Throughput: one node vs the plain PyTorch loop ({s.model})",
        "",
        f"`{command}`",
        "",
        f"Machine: {machine_line(s)}. Load average (1 min) during the run: "
        f"{min(load):.2f}–{max(load):.2f}.",
        "",
        f"Table 1: {s.rounds} timed rounds of {s.local_steps} steps per size after one warm-up "
        "round, node and plain loop alternating; the node is `Node.train` with the codasca "
        "backend. Median (range) over rounds.",
        "",
        "| image size | batch | node img/s | plain loop img/s | node time / plain time |",
        "|---|---|---|---|---|",
    ]
    for r in sizes:
        lines.append(
            f"| {r['size']} px | {r['batch']} | {_spread(r['node'])} | {_spread(r['plain'])} "
            f"| {_spread(r['time_ratio'], 3)} |"
        )
    size, batch = s.variant_size
    lines += [
        "",
        f"Table 2: the plain loop at {size} px, batch {batch}, {2 * s.local_steps} timed steps "
        f"after one warm-up step, each measurement a fresh process ({s.repeats} per setting, "
        "order rotated). Median (range).",
        "",
        "| setting | img/s | first step (s) |",
        "|---|---|---|",
    ]
    lines += [f"| {v['name']} | {_spread(v['img_s'])} | {v['warmup_s']:.1f} |" for v in variants]
    if cli:
        lines += [
            "",
            f"Table 3: wall time of `fed-auc --threads T simulate --model tiny --sites 2 "
            f"--rounds {s.rounds}` (process start included), OMP_NUM_THREADS unset, "
            f"{s.repeats} runs each, order rotated. Median (range).",
            "",
            "| --threads | wall time (s) |",
            "|---|---|",
        ]
        lines += [f"| {c['threads']} | {_spread(c['wall_s'])} |" for c in cli]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few steps, small batches at 128+")
    parser.add_argument("--threads", type=int, help="torch threads for table 1 (default 1)")
    parser.add_argument("--markdown", type=Path, help="write the result tables here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    s = QUICK if args.quick else Settings()
    if args.threads:
        s = Settings(**{**vars(s), "threads": args.threads})
    torch.set_num_threads(s.threads)
    load = [os.getloadavg()[0]]
    sizes = []
    for size, batch in s.sizes:
        sizes.append(node_vs_plain(s.model, size, batch, s.local_steps, s.rounds, s.seed))
        print(f"{size} px: done", file=sys.stderr, flush=True)  # progress; tables at the end
        load.append(os.getloadavg()[0])
    variants = variant_table(s)
    load.append(os.getloadavg()[0])
    cli = cli_threads_table(s)
    load.append(os.getloadavg()[0])
    command = command_line()
    text = markdown(sizes, variants, s, command, load, cli)
    emit(text, args.markdown)


if __name__ == "__main__":
    main()
