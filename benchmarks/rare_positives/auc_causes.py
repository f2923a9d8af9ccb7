"""Why the AUC backend trails FedAvg-CE with rare positives: one controlled change at a time.

Each variant is the file recipe of ``auc_vs_ce.py`` with one option changed, run with one
backend on one federation over the same seeds; the table gives validation AUC (what a
default is chosen on) and its paired difference to the unchanged recipe with a 95 %
t-interval, and test AUC for information only. Variants the issue lists: the dual step, the
classifier after the CE warm-up, the warm-up length, the positive floor against the p of the
loss, the lr of the AUC phase and its decay, and the server step (CODASCA's η_g).

    python -m benchmarks.rare_positives.auc_causes --federation breast_5 --seeds 0 1 2 --jobs 2
    python -m benchmarks.rare_positives.auc_causes --recipe current \\
        --variants "warm-up 0 rounds" ...

``--recipe screened`` (the default) changes the recipe as it was first screened; ``--recipe
current`` changes today's: the CODASCA arm of ``auc_vs_ce.py`` with the image-file defaults.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common.stats import paired_ci
from benchmarks.rare_positives.auc_vs_ce import ARMS, FEDERATIONS, NPZ, command, mean_sd, run_one

BASE = "recipe"
# The recipe every variant changes one thing of: the file recipe as it was screened (lr 0.2,
# α at the paper's step η, the warm-up's classifier kept; since then image files default to
# the recentered head and α's step η/(p(1−p))); later options win.
SCREENED = ["--lr", "0.2", "--warmup-head", "keep", "--backend-option", "dual_lr=0.2"]


# Each recipe: the options every variant adds to, and the arm of auc_vs_ce.py it runs.
RECIPES: dict[str, tuple[list[str], str]] = {
    "screened": (SCREENED, "CODASCA, paper's α step"),
    "current": ([], "CODASCA"),  # lr 0.8, recentered head, dual_lr=prevalence
}


def lr(value: str) -> list[str]:
    """A learning rate for the warm-up and the AUC phase, α's step at the paper's η with it."""
    return ["--lr", value, "--backend-option", f"dual_lr={value}"]


RECENTER = ["--warmup-head", "recenter"]


def dual(value: str) -> list[str]:
    """α's own step size."""
    return ["--backend-option", f"dual_lr={value}"]


VARIANTS: dict[str, list[str]] = {
    BASE: [],
    "dual_lr = 20η (≈ 1/(p(1−p)) at p = 0.05)": ["--backend-option", "dual_lr=4.0"],
    "classifier re-initialized after warm-up": ["--warmup-head", "reset"],
    "classifier bias recentered after warm-up": RECENTER,
    "recentered + dual_lr = 20η": [*RECENTER, "--backend-option", "dual_lr=4.0"],
    "warm-up 10 rounds": ["--warmup-rounds", "10"],
    "warm-up 0 rounds": ["--warmup-rounds", "0", "--warmup-head", "keep"],  # no head to change
    "positive floor 0.2 per batch": ["--min-pos-fraction", "0.2"],
    "lr 0.1": lr("0.1"),
    "lr 0.4": lr("0.4"),
    "lr 0.8": lr("0.8"),
    "lr 0.4, dual_lr = 20η": ["--lr", "0.4", *dual("8.0")],
    "lr 0.4, recentered, dual_lr = 20η": ["--lr", "0.4", *RECENTER, *dual("8.0")],
    "lr 0.8, recentered, dual_lr = 20η": ["--lr", "0.8", *RECENTER, *dual("16.0")],
    "lr ÷ 3 every 5 rounds": ["--decay-every", "40"],
    "η_g = 2 (server step)": ["--eta-g", "2.0"],
    "GroupNorm instead of BatchNorm": ["--norm", "group"],
    "AUC-square loss": ["--loss", "auc_square"],
}  # fmt: skip


def screen(
    federation: str, arm: str, variants: list[str], seeds: list[int], jobs: int, npz: Path,
    base: list[str] = SCREENED,
) -> dict[str, dict[int, dict]]:  # fmt: skip
    runs = Path(tempfile.mkdtemp(prefix="auc_causes_"))
    results: dict[str, dict[int, dict]] = {v: {} for v in variants}
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, 2))) as pool:
        futures = {
            (v, s): pool.submit(
                run_one,
                command(federation, arm, s, runs / str(i), npz, extra=base + VARIANTS[v]),
            )
            for s in seeds
            for i, v in enumerate(variants)
        }
        for (v, s), future in futures.items():
            results[v][s] = future.result()
            print(v, s, results[v][s], file=sys.stderr, flush=True)
    return results


def table(results: dict[str, dict[int, dict]], base: str = BASE) -> str:
    lines = [
        "| variant | validation AUC | Δ validation vs recipe [95 % CI] | test AUC (not used) "
        "| minutes per run |",
        "|---|---|---|---|---|",
    ]
    for name, by_seed in results.items():
        seeds = sorted(by_seed)
        val = mean_sd([by_seed[s]["val_auc"] for s in seeds])
        test = mean_sd([by_seed[s]["test_auc"] for s in seeds])
        minutes = statistics.fmean(by_seed[s]["seconds"] for s in seeds) / 60
        if name == base:
            delta = "—"
        else:
            paired = [s for s in seeds if s in results[base]]
            diffs = [by_seed[s]["val_auc"] - results[base][s]["val_auc"] for s in paired]
            mean, lo, hi = paired_ci(diffs)
            delta = f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]"
        lines.append(f"| {name} | {val} | {delta} | {test} | {minutes:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--federation", choices=list(FEDERATIONS), default="breast_5")
    parser.add_argument("--recipe", choices=list(RECIPES), default="screened")
    parser.add_argument("--arm", choices=list(ARMS), help="default: the recipe's")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--npz", type=Path, default=NPZ)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    variants = [BASE, *[v for v in args.variants if v != BASE]]
    start = time.perf_counter()
    base, default_arm = RECIPES[args.recipe]
    arm = args.arm or default_arm
    results = screen(args.federation, arm, variants, args.seeds, args.jobs, args.npz, base)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    elapsed = time.perf_counter() - start
    print(f"\n{args.federation}, {arm}, {args.recipe} recipe, seeds {args.seeds}, {elapsed:.0f} s")
    print(table(results))


if __name__ == "__main__":
    main()
