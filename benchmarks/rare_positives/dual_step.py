"""Dual step size (issue 18 item 9): the paper's single η vs α's own step ``dual_lr``.

E[∂F/∂α] = 2p(1−p)(m + μ⁻ − μ⁺ − α): with one step size α moves 1/(p(1−p)) times slower
than under LibAUC's PESG. For each setting and seed this runs ``fed-auc simulate`` and reads
the exported model's card: validation AUC (what the default is chosen on) and test AUC.
Prints, per federation, mean ± sd per setting and the paired difference to the paper
setting (seed by seed) with its 95 % t-interval.

    python -m benchmarks.rare_positives.dual_step --federation synthetic --seeds 0 1 2 3 4 --jobs 2
    python -m benchmarks.rare_positives.dual_step --federation breastmnist \\
        --rounds 30 --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common.paths import BREASTMNIST
from benchmarks.common.simulate import simulate
from benchmarks.common.stats import paired_ci

# settings: name -> dual_lr as a multiple of the run's lr (None = the paper's single η)
SETTINGS = {"paper (dual_lr = η)": None, "dual_lr = 5η": 5.0}
FEDERATIONS = {
    "synthetic": {"lr": 0.1, "rounds": 40, "args": []},
    "breastmnist": {
        "lr": 0.2,
        "rounds": 60,
        "args": [
            "--data",
            f"medmnist:{BREASTMNIST}",
            "--partition",
            "dirichlet:0.5",
            "--sites",
            "4",
            "--model",
            "small",
            "--warmup-rounds",
            "10",
        ],
    },
}


def command(federation: str, rounds: int, seed: int, multiple: float | None, runs: Path):
    fed = FEDERATIONS[federation]
    cmd = ["fed-auc", "--threads", "1", "simulate", *fed["args"], "--rounds", str(rounds)]
    cmd += ["--lr", str(fed["lr"]), "--seed", str(seed), "--json", "--runs-dir", str(runs)]
    if multiple is not None:
        cmd += ["--backend-option", f"dual_lr={multiple * fed['lr']}"]
    return cmd


def run_one(federation: str, rounds: int, seed: int, multiple: float | None, runs: Path) -> dict:
    summary, card = simulate(command(federation, rounds, seed, multiple, runs))
    return {"val_auc": card["global_val_auc"], "test_auc": summary["exported_auc"]}


def table(federation: str, results: dict[str, dict[int, dict]]) -> str:
    base = next(iter(SETTINGS))
    lines = [
        f"| {federation} | validation AUC | test AUC | Δ val vs paper [95 % CI] "
        "| Δ test vs paper [95 % CI] |",
        "|---|---|---|---|---|",
    ]
    for name, by_seed in results.items():
        row = [name]
        for key in ("val_auc", "test_auc"):
            vals = [r[key] for r in by_seed.values()]
            sd = statistics.stdev(vals) if len(vals) > 1 else math.nan
            row.append(f"{statistics.fmean(vals):.3f} ± {sd:.3f}")
        for key in ("val_auc", "test_auc"):
            if name == base:
                row.append("—")
                continue
            seeds = sorted(set(by_seed) & set(results[base]))
            diffs = [by_seed[s][key] - results[base][s][key] for s in seeds]
            mean, lo, hi = paired_ci(diffs)
            row.append(f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--federation", choices=list(FEDERATIONS), default="synthetic")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (at most 2)")
    parser.add_argument("--out", type=Path, default=None, help="write per-seed JSON here")
    args = parser.parse_args()
    rounds = args.rounds or FEDERATIONS[args.federation]["rounds"]
    runs = Path(tempfile.mkdtemp(prefix="dual_step_"))
    jobs = [(name, mult, seed) for seed in args.seeds for name, mult in SETTINGS.items()]
    with ThreadPoolExecutor(max_workers=min(args.jobs, 2)) as pool:
        futures = {
            job: pool.submit(run_one, args.federation, rounds, job[2], job[1], runs / job[0][:5])
            for job in jobs
        }
        results: dict[str, dict[int, dict]] = {name: {} for name in SETTINGS}
        for (name, _, seed), future in futures.items():
            results[name][seed] = future.result()
            print(name, seed, results[name][seed], flush=True)
    if args.out:
        args.out.write_text(json.dumps({"rounds": rounds, "results": results}, indent=1))
    print(f"\n{args.federation}, {rounds} rounds, seeds {args.seeds}\n")
    print(table(args.federation, results))


if __name__ == "__main__":
    main()
