"""Bytes per round and paired test AUC of ``--compress fp16`` and ``int8`` against uncompressed.

Every arm trains the same federation with the same seed (data, sampling, initialization),
in-process, and differs only in how train requests and replies travel. The exported model is
chosen by the same rule for every arm (the run's default: best pooled validation AUC), and its
pooled test AUC is compared with the uncompressed arm of the same seed: the mean paired
difference and its 95 % t-interval over seeds. Bytes per round are what the coordinator
records (all sites, down + up), as ``fed-auc simulate`` and a Flower run record them.

    python -m benchmarks.systems.compression --quick
    python -m benchmarks.systems.compression --npz ../shared/data/breastmnist.npz --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks.common.fragment import emit, provenance
from benchmarks.common.stats import paired_ci

MODES = ("none", "fp16", "int8")


def train(data: str, mode: str, seed: int, options: dict) -> dict:
    """One arm and seed: pooled test AUC of the exported model and bytes per round."""
    import torch

    from fed_auc.experiment.config import ExperimentConfig
    from fed_auc.simulation import run_simulation
    from fed_auc.store.run_store import RunStore

    torch.set_num_threads(1)
    extra = {} if data == "synthetic" else {"data": data, "partition": "dirichlet:0.5"}
    with tempfile.TemporaryDirectory() as runs_dir:
        config = ExperimentConfig(compress=mode, seed=seed, runs_dir=runs_dir, **options, **extra)
        summary = run_simulation(config)
        with RunStore(runs_dir) as store:
            rounds = store.rounds(summary["run_id"])
    trained = rounds[rounds["round"] > 0]
    per_round = float((trained["bytes_up"] + trained["bytes_down"]).mean())
    return {"data": data, "mode": mode, "seed": seed, "auc": summary["exported_auc"],
            "bytes": per_round}  # fmt: skip


def table(results: list[dict], modes: tuple[str, ...] = MODES) -> str:
    lines = [
        "| data | compress | MB per round | fewer bytes | test AUC (mean ± sd) | "
        "paired Δ AUC vs none [95 % CI] |",
        "|---|---|---|---|---|---|",
    ]
    for data in dict.fromkeys(r["data"] for r in results):
        arm = {m: sorted((r for r in results if r["data"] == data and r["mode"] == m),
                         key=lambda r: r["seed"]) for m in modes}  # fmt: skip
        plain = statistics.fmean(r["bytes"] for r in arm["none"])
        for mode in modes:
            rows = arm[mode]
            aucs = [r["auc"] for r in rows]
            sd = statistics.stdev(aucs) if len(aucs) > 1 else 0.0
            mb = statistics.fmean(r["bytes"] for r in rows)
            paired = "—"
            if mode != "none":
                diffs = [r["auc"] - p["auc"] for r, p in zip(rows, arm["none"], strict=True)]
                mean, low, high = paired_ci(diffs)
                paired = f"{mean:+.4f} [{low:+.4f}, {high:+.4f}]"
            name = Path(data).name if data != "synthetic" else data
            lines.append(f"| {name} | {mode} | {mb / 1e6:.3f} | {plain / mb:.2f}× | "
                         f"{statistics.fmean(aucs):.4f} ± {sd:.4f} | {paired} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, 6 rounds, 2 seeds")
    parser.add_argument("--npz", help="a MedMNIST file (e.g. ../shared/data/breastmnist.npz)")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--secure",
        action="store_true",
        help="with --secure-aggregation (int8 is refused there: none and fp16 only)",
    )
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    modes = MODES[:2] if args.secure else MODES
    if args.quick:
        args.rounds, seeds = 6, seeds[:2]
    options = {"model": args.model, "image_size": args.image_size, "sites": 4,
               "rounds": args.rounds, "local_steps": 8, "batch_size": 16,
               "secure_aggregation": args.secure}  # fmt: skip
    datasets = ["synthetic"] + ([f"medmnist:{args.npz}"] if args.npz else [])
    start = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        futures = [pool.submit(train, d, m, s, options) for d in datasets for m in modes
                   for s in seeds]  # fmt: skip
        results = []
        for future in futures:  # as they finish, so that a cut-short run shows what it has
            results.append(future.result())
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    header = provenance(
        ",".join(map(str, seeds)),
        time.perf_counter() - start,
        f"CODASCA, 4 sites, {args.model} at {args.image_size} px, I = 8, batch 16, "
        + ("secure aggregation, " if args.secure else "")
        + f"{args.rounds} rounds; synthetic federation (default profiles)"
        + (", BreastMNIST split Dirichlet(0.5)" if args.npz else "")
        + "; exported model: best pooled validation AUC (the same rule for every arm).",
    )
    emit(header + "\n\n" + table(results, modes) + "\n", args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
