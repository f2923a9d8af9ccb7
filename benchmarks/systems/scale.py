"""Scale: time per round and peak memory of ``fed-auc simulate`` with 4 to 256 sites.

In-process nodes share one warm model, and beyond 16 sites each node's local state (CODASCA's
c_k: one model's size per site) lives on disk between rounds, so peak memory should stay
nearly flat as sites grow (target: 256 sites ≤ 1.5 × the peak at 4) while time per round
grows linearly in the sites *selected* per round. Two sweeps, each setting in a fresh process
(peak RSS is per process):

- sites N ∈ {4, 16, 64, 256} with a fixed number k of sites selected per round;
- N fixed at the largest, k ∈ {4, 8, 16, 32}: time per round against k (a least-squares line).

Time per round is training only (no evaluation rounds are timed: ``eval_every`` skips them);
the median over the timed rounds after a warm-up round. Data of every site is in memory (the
simulator holds all hospitals' images), so it is reported next to the peak.

    python -m benchmarks.systems.scale --quick
    python -m benchmarks.systems.scale --markdown benchmarks/results/scale.md
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common.fragment import emit, provenance
from benchmarks.common.paths import ROOT

MODELS = {"tiny": 28, "densenet121": 32}


def measure(
    model: str,
    sites: int,
    selected: int,
    rounds: int,
    local_steps: int,
    data_scale: float,
    runs_dir: str,
    batch_size: int = 32,
) -> dict[str, float]:
    """One federation in this process: per-round training time, peak RSS, data and state."""
    import torch

    from fed_auc.experiment.config import ExperimentConfig
    from fed_auc.simulation import build_federation

    config = ExperimentConfig(
        model=model,
        image_size=MODELS[model],
        sites=sites,
        participation=selected / sites,
        rounds=rounds + 1,
        local_steps=local_steps,
        data_scale=data_scale,
        batch_size=batch_size,
        runs_dir=runs_dir,
    )
    fed = build_federation(config)
    coordinator = fed.coordinator
    times = []
    for r in range(rounds + 1):  # round 1 warms up
        start = time.perf_counter()
        record = coordinator.run_round(evaluate=False)
        if r > 0:
            times.append(time.perf_counter() - start)
        assert sum(s.status == "completed" for s in record.sites) == selected
    coordinator.close()
    fed.store.close()
    data = sum(
        t.element_size() * t.nelement()
        for site in fed.sites
        for split in (site.train, site.val, site.test)
        for t in (split.images, split.labels)
    )
    state = sum(p.stat().st_size for p in (Path(runs_dir) / fed.run_id / "nodes").rglob("*.pt"))
    return {
        "round_s": statistics.median(times),
        "round_s_min": min(times),
        "round_s_max": max(times),
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "data_mb": data / 1e6,
        "state_disk_mb": state / 1e6,
        "threads": torch.get_num_threads(),
    }


def measure_in_fresh_process(**setting) -> dict[str, float]:
    """``measure`` in a new interpreter, so each setting's peak memory is its own."""
    with tempfile.TemporaryDirectory() as runs_dir:
        args = json.dumps({**setting, "runs_dir": runs_dir})
        out = subprocess.run(
            [sys.executable, "-m", __spec__.name, "--child", args],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,  # the repository root: where `benchmarks` and `fed_auc` import from
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Intercept, slope and R² of the least-squares line y = a + b·x."""
    slope, intercept = np.polyfit(xs, ys, 1)
    predicted = intercept + slope * np.asarray(xs)
    residual = float(np.sum((np.asarray(ys) - predicted) ** 2))
    total = float(np.sum((np.asarray(ys) - np.mean(ys)) ** 2))
    return float(intercept), float(slope), 1.0 - residual / total if total else 1.0


def run(models: list[str], site_counts: list[int], selections: list[int], **fixed) -> str:
    """Both sweeps for every model, as Markdown tables."""
    lines = []
    for model in models:
        lines += [
            f"#### {model} @ {MODELS[model]} px: sites grow, {selections[0]} selected per round",
            "",
            "| sites | s/round (median, range) | peak RSS MB | × peak at "
            f"{site_counts[0]} | data in memory MB | node state on disk MB |",
            "|---:|---|---:|---:|---:|---:|",
        ]
        base = None
        for n in site_counts:
            r = measure_in_fresh_process(model=model, sites=n, selected=selections[0], **fixed)
            base = base or r["peak_mb"]
            lines.append(
                f"| {n} | {r['round_s']:.2f} ({r['round_s_min']:.2f}–{r['round_s_max']:.2f}) "
                f"| {r['peak_mb']:.0f} | **{r['peak_mb'] / base:.2f}** | {r['data_mb']:.1f} "
                f"| {r['state_disk_mb']:.1f} |"
            )
        n = site_counts[-1]
        lines += [
            "",
            f"#### {model} @ {MODELS[model]} px: {n} sites, selected per round grows",
            "",
            "| selected k | s/round (median, range) | s per selected site | peak RSS MB |",
            "|---:|---|---:|---:|",
        ]
        xs, ys = [], []
        for k in selections:
            r = measure_in_fresh_process(model=model, sites=n, selected=k, **fixed)
            xs.append(k)
            ys.append(r["round_s"])
            lines.append(
                f"| {k} | {r['round_s']:.2f} ({r['round_s_min']:.2f}–{r['round_s_max']:.2f}) "
                f"| {r['round_s'] / k:.3f} | {r['peak_mb']:.0f} |"
            )
        a, b, r2 = linear_fit(xs, ys)
        lines += ["", f"Least squares: s/round = {a:.2f} + {b:.3f} · k (R² = {r2:.3f}).", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 timed rounds")
    parser.add_argument("--models", help="comma-separated (full: tiny,densenet121)")
    parser.add_argument("--markdown", type=Path, help="write the tables to this file")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(**json.loads(args.child))))
        return
    fixed = {"rounds": 2 if args.quick else 3, "local_steps": 4, "data_scale": 0.05}
    models = (args.models or ("tiny" if args.quick else "tiny,densenet121")).split(",")
    started = time.perf_counter()
    tables = run(models, [4, 16, 64, 256], [4, 8, 16, 32], **fixed)
    settings = (
        f"CODASCA, {fixed['local_steps']} local steps, batch 32, synthetic hospitals at "
        f"data_scale {fixed['data_scale']}, {fixed['rounds']} timed rounds after 1 warm-up, "
        "each setting in a fresh process."
    )
    text = provenance("0", time.perf_counter() - started, settings)
    emit(f"{text}\n\n{tables}", args.markdown)


if __name__ == "__main__":
    main()
