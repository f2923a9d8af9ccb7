"""Every backend on the same synthetic federation with heterogeneous local work.

Same seed, same data, same per-site τ_i draws (seeded by site and round, so every backend's
sites do the same local steps per round), same rounds: pooled and worst-site test AUC after
the budget, megabytes communicated (down + up, all phases), and AUC gained per MB.

    python -m benchmarks.claims.compare_backends --quick
    python -m benchmarks.claims.compare_backends --markdown benchmarks/results/compare_backends.md
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common.fragment import emit, provenance
from fed_auc.algorithms import ALGORITHMS
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore

ORDER = (
    "fedavg",
    "local_sgda",
    "coda_plus",
    "codasca",
    "fed_norm_sgda",
    "fed_norm_sgda_plus",
    "fedsgda_mb",
    "fedsgda_storm",
)


def run(algorithm: str, **options: Any) -> dict[str, float]:
    """One backend's run: final/best pooled AUC, worst site, MB moved, AUC gain per MB."""
    with tempfile.TemporaryDirectory() as runs_dir:
        summary = run_simulation(
            ExperimentConfig(algorithm=algorithm, runs_dir=runs_dir, **options)
        )
        with RunStore(runs_dir) as store:
            rounds = store.rounds(summary["run_id"])
            steps = store.site_rounds(summary["run_id"])["steps"].sum()
    megabytes = (rounds["bytes_down"].sum() + rounds["bytes_up"].sum()) / 2**20
    auc = summary["global_auc"]
    return {
        "auc0": auc[0],
        "auc": auc[-1],
        "best": max(a for a in auc if a is not None),
        "worst": summary["worst_site_auc"][-1],
        "mb": megabytes,
        "gain_per_mb": (auc[-1] - auc[0]) / megabytes,
        "steps": int(steps),
    }


def table(results: dict[str, dict[str, float]]) -> str:
    lines = [
        "| backend | pooled test AUC | worst-site AUC | MB (down + up) | AUC gain per MB "
        "| local steps |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['auc']:.3f} (best {r['best']:.3f}) | {r['worst']:.3f} "
            f"| {r['mb']:.1f} | {r['gain_per_mb']:.4f} | {r['steps']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="6 rounds, τ_i from 2:8")
    parser.add_argument("--rounds", type=int, help="rounds (full: 40, quick: 6)")
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--local-steps-range", help="τ_i range MIN:MAX (full: 2:16, quick: 2:8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", help="a subset of backends")
    parser.add_argument("--markdown", type=Path, help="write the table to this file")
    args = parser.parse_args()
    rounds = args.rounds or (6 if args.quick else 40)
    steps_range = args.local_steps_range or ("2:8" if args.quick else "2:16")
    every = [*ORDER, *sorted(set(ALGORITHMS) - set(ORDER))]  # a new backend gets its row too
    names = [n for n in every if n in ALGORITHMS and (not args.only or n in args.only)]
    options = {"sites": args.sites, "rounds": rounds, "local_steps_range": steps_range}
    started = time.perf_counter()
    results = {}
    for name in names:
        results[name] = run(name, seed=args.seed, **options)
        print(table({name: results[name]}).splitlines()[-1], flush=True)  # progress
    auc0 = ", ".join(sorted({f"{r['auc0']:.3f}" for r in results.values()}))
    settings = (
        f"{args.sites} synthetic hospitals, tiny DenseNet @ 28 px, batch 32, lr 0.1, {rounds} "
        f"rounds, full participation, τ_i drawn per site and round from {steps_range}; pooled "
        f"test AUC at round 0: {auc0}; AUC gain per MB = (final − round 0) / MB."
    )
    elapsed = time.perf_counter() - started
    emit(f"{provenance(str(args.seed), elapsed, settings)}\n\n{table(results)}", args.markdown)


if __name__ == "__main__":
    main()
