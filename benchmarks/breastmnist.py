"""BreastMNIST: federated (dirichlet:0.5, 4 sites, CODASCA) vs centralized (--sites 1).

Runs `fed-auc simulate` once per seed and setting, then prints the pooled test AUC of the
exported model (the round with the best validation AUC) as mean ± sd over seeds. Every run
uses one torch thread (OMP_NUM_THREADS=1): on a shared 2-core machine two threads made the
same round 20× slower by spinning. Results: BENCHMARKS.md, section "BreastMNIST".

    python benchmarks/breastmnist.py --npz ../shared/data/breastmnist.npz --model tiny \
        --image-size 28 --rounds 30 --warmup-rounds 10 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def run(args: argparse.Namespace, seed: int, federated: bool) -> dict:
    setting = ["--partition", "dirichlet:0.5", "--sites", "4", "--local-steps", "8"]
    if not federated:  # same images per round as 4 sites × 8 steps
        setting = ["--sites", "1", "--local-steps", "32"]
    command = [sys.executable, "-m", "fed_auc.cli", "simulate", "--json"]
    command += ["--data", f"medmnist:{args.npz}", "--algorithm", "codasca"]
    command += ["--model", args.model, "--image-size", str(args.image_size)]
    command += ["--rounds", str(args.rounds), "--warmup-rounds", str(args.warmup_rounds)]
    command += ["--batch-size", "32", "--seed", str(seed), "--runs-dir", args.runs_dir, *setting]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    summary = json.loads(out.stdout)
    selected = summary["selected_round"]
    return {"seed": seed, "selected_round": selected, "test_auc": summary["global_auc"][selected]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npz", default="../shared/data/breastmnist.npz")
    parser.add_argument("--model", default="densenet121")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup-rounds", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runs-dir", default="runs/breastmnist")
    parser.add_argument("--out", type=Path, help="write the per-seed results as JSON here")
    parser.add_argument(
        "--settings", nargs="+", default=["federated", "centralized"], help="which to run"
    )
    args = parser.parse_args()
    results = {}
    for name in args.settings:
        federated = name == "federated"
        results[name] = [run(args, seed, federated) for seed in args.seeds]
        aucs = [r["test_auc"] for r in results[name]]
        sd = statistics.stdev(aucs) if len(aucs) > 1 else 0.0
        print(
            f"{name}: test AUC {statistics.mean(aucs):.3f} ± {sd:.3f} over seeds {args.seeds}"
            f" ({', '.join(f'{a:.3f}' for a in aucs)})",
            flush=True,
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
