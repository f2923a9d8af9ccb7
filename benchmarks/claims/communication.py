"""The CODASCA claim: final test AUC against the communication window I, CODASCA vs CODA+.

Imbalanced, heterogeneous federation as in the paper's IH benchmarks (§4.1): K synthetic
hospitals, each with its own scanner (feature-disjoint sites), every site's training
positive ratio cut to 10 % by removing positives (``--partition imratio:0.1,...``), test
splits untouched. Every run does the same T local steps per site: I local steps per round,
T / I rounds; the model is evaluated at round 0 and after the last round only.
I_max = the largest I whose AUC is within 0.01 of I = 1; the paper reports
I_max(CODASCA) / I_max(CODA+) = 4 on ImageNet-IH with K = 8 and 16 (Figure 1).

Runs are independent, so they go two at a time (one torch thread each) on the 2 cores.

    python -m benchmarks.claims.communication --quick
    python -m benchmarks.claims.communication --markdown benchmarks/results/communication.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks.common.fragment import emit, provenance
from benchmarks.common.paths import ROOT

ALGORITHMS = ("codasca", "coda_plus")
WINDOWS = (1, 4, 16, 64, 256)
TOLERANCE = 0.01
PLOT = ROOT / "docs" / "auc_vs_I.png"


def final_auc(
    algorithm: str,
    window: int,
    sites: int,
    seed: int,
    steps: int,
    image_size: int,
    data_scale: float,
    imratio: float = 0.1,
    batch_size: int = 32,
) -> float:
    """Pooled test AUC after T = ``steps`` local steps per site in rounds of I = ``window``."""
    import torch

    from fed_auc.experiment.config import ExperimentConfig
    from fed_auc.simulation import run_simulation

    torch.set_num_threads(1)
    rounds = steps // window
    with tempfile.TemporaryDirectory() as runs_dir:
        summary = run_simulation(
            ExperimentConfig(
                algorithm=algorithm,
                sites=sites,
                partition="imratio:" + ",".join([str(imratio)] * sites),
                rounds=rounds,
                local_steps=window,
                eval_every=rounds,
                select="last",
                image_size=image_size,
                data_scale=data_scale,
                batch_size=batch_size,
                seed=seed,
                runs_dir=runs_dir,
            )
        )
    return summary["global_auc"][-1]


def i_max(aucs: dict[int, float], tolerance: float = TOLERANCE) -> int:
    """The largest window whose AUC is within ``tolerance`` of the AUC at I = 1."""
    reference = aucs[1]
    return max(i for i, auc in aucs.items() if auc >= reference - tolerance)


def sweep(
    site_counts: list[int], seeds: list[int], windows: list[int], workers: int, **fixed
) -> dict[tuple[int, str, int, int], float]:
    """AUC of every (K, algorithm, I, seed), computed ``workers`` at a time."""
    keys = [(k, a, i, s) for k in site_counts for a in ALGORITHMS for i in windows for s in seeds]
    with ProcessPoolExecutor(workers) as pool:
        futures = {
            key: pool.submit(final_auc, key[1], key[2], key[0], key[3], **fixed) for key in keys
        }
        return {key: future.result() for key, future in futures.items()}


def table(results: dict[tuple[int, str, int, int], float], seeds: list[int]) -> str:
    """AUC per I (mean ± sd over seeds) and I_max per algorithm, per K."""
    lines = []
    for k in sorted({key[0] for key in results}):
        windows = sorted({key[2] for key in results if key[0] == k})
        lines += [
            f"K = {k} sites: final pooled test AUC (mean ± sd over seeds {seeds})",
            "",
            "| algorithm | " + " | ".join(f"I = {i}" for i in windows) + " | I_max |",
            "|---|" + "---:|" * (len(windows) + 1),
        ]
        ratios = []
        for algorithm in ALGORITHMS:
            per_seed = [{i: results[k, algorithm, i, s] for i in windows} for s in seeds]
            mean = {i: statistics.fmean(p[i] for p in per_seed) for i in windows}
            cells = [_mean_sd([p[i] for p in per_seed]) for i in windows]
            seed_imax = [i_max(p) for p in per_seed]
            lines.append(
                f"| {algorithm} | " + " | ".join(cells) + f" | **{i_max(mean)}** "
                f"(per seed {', '.join(map(str, seed_imax))}) |"
            )
            ratios.append(i_max(mean))
        lines += ["", f"I_max(CODASCA) / I_max(CODA+) = {ratios[0] / ratios[1]:g} (paper: 4).", ""]
    return "\n".join(lines)


def _mean_sd(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def plot(results: dict[tuple[int, str, int, int], float], path: Path) -> None:
    """AUC vs I (log scale), one panel per K, mean ± sd over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({key[0] for key in results})
    fig, axes = plt.subplots(1, len(counts), figsize=(5 * len(counts), 3.6), squeeze=False)
    for ax, k in zip(axes[0], counts, strict=True):
        for algorithm, marker in zip(ALGORITHMS, "os", strict=True):
            windows = sorted({key[2] for key in results if key[0] == k})
            values = [
                [v for key, v in results.items() if key[:3] == (k, algorithm, i)] for i in windows
            ]
            means = [statistics.fmean(v) for v in values]
            sds = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
            ax.errorbar(windows, means, yerr=sds, marker=marker, capsize=3, label=algorithm)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("communication window I (local steps per round)")
        ax.set_ylabel("final pooled test AUC")
        ax.set_title(f"K = {k} sites, imratio 10 %, same local steps")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="K = 8, one seed, T = 256")
    parser.add_argument("--sites", help="comma-separated K values (full: 8,16)")
    parser.add_argument("--seeds", help="comma-separated seeds (full: 0,1,2)")
    parser.add_argument("--steps", type=int, help="local steps T per site (full: 512)")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--data-scale", type=float, default=0.5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--plot", type=Path, default=PLOT)
    parser.add_argument("--markdown", type=Path, help="write the tables to this file")
    args = parser.parse_args()
    sites = [int(k) for k in (args.sites or ("8" if args.quick else "8,16")).split(",")]
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]
    steps = args.steps or (256 if args.quick else 512)
    windows = [i for i in WINDOWS if i <= steps]
    started = time.perf_counter()
    results = sweep(
        sites,
        seeds,
        windows,
        args.workers,
        steps=steps,
        image_size=args.image_size,
        data_scale=args.data_scale,
    )
    plot(results, args.plot)
    settings = (
        f"Tiny DenseNet at {args.image_size} px, batch 32, lr 0.1, γ = 1/500, η_g = 1, "
        f"T = {steps} local steps per site (I per round, T / I rounds), synthetic hospitals at "
        f"data_scale {args.data_scale}, training imratio 10 %; {args.workers} runs at a time, "
        f"one torch thread each; plot `{os.path.relpath(args.plot, ROOT)}`."
    )
    text = provenance(",".join(map(str, seeds)), time.perf_counter() - started, settings)
    emit(f"{text}\n\n{table(results, seeds)}", args.markdown)


if __name__ == "__main__":
    main()
