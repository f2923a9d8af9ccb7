"""Every backend on the same synthetic federation with heterogeneous local work.

Same seed, same data, same per-site τ_i draws (seeded by site and round, so every backend's
sites do the same local steps per round), same rounds: pooled and worst-site test AUC after
the budget, megabytes communicated (down + up, all phases), and AUC gained per MB.

    python benchmarks/compare_backends.py --rounds 40 --local-steps-range 2:16
"""

from __future__ import annotations

import argparse
import tempfile

from fed_auc.algorithms import ALGORITHMS
from fed_auc.simulation import SimulationConfig, run_simulation
from fed_auc.store import RunStore

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


def run(algorithm: str, args: argparse.Namespace, runs_dir: str) -> dict[str, float]:
    config = SimulationConfig(
        algorithm=algorithm,
        sites=args.sites,
        rounds=args.rounds,
        local_steps_range=args.local_steps_range,
        seed=args.seed,
        runs_dir=runs_dir,
    )
    summary = run_simulation(config)
    with RunStore(runs_dir) as store:
        rounds = store.rounds(summary["run_id"])
        steps = store.site_rounds(summary["run_id"])["steps"].sum()
    megabytes = (rounds["bytes_down"].sum() + rounds["bytes_up"].sum()) / 2**20
    auc = summary["global_auc"]
    return {
        "auc": auc[-1],
        "best": max(a for a in auc if a is not None),
        "worst": summary["worst_site_auc"][-1],
        "mb": megabytes,
        "gain_per_mb": (auc[-1] - auc[0]) / megabytes,
        "steps": int(steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--local-steps-range", default="2:16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", help="a subset of backends")
    args = parser.parse_args()
    names = [n for n in ORDER if n in ALGORITHMS and (not args.only or n in args.only)]
    print(
        "| backend | pooled test AUC | worst-site AUC | MB (down + up) | AUC gain per MB "
        "| local steps |"
    )
    print("|---|---|---|---|---|---|")
    for name in names:
        with tempfile.TemporaryDirectory() as runs_dir:
            r = run(name, args, runs_dir)
        print(
            f"| {name} | {r['auc']:.3f} (best {r['best']:.3f}) | {r['worst']:.3f} "
            f"| {r['mb']:.1f} | {r['gain_per_mb']:.4f} | {r['steps']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
