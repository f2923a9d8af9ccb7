"""Deep AUC maximization against FedAvg with cross-entropy where positives are rare (issue 19).

For every federation and seed this runs ``fed-auc simulate`` once per contender (the same
partition, initialization and warm-up for all of them: the seed fixes them) and reads the
exported model's card: validation AUC (what a recipe is chosen on) and test AUC of the
validation-selected model. Per federation the table gives mean ± sd over seeds and, seed by
seed, each contender's paired difference to FedAvg-CE with its 95 % t-interval; with
``--libauc`` a centralized LibAUC run (AUC-margin + PESG on the pooled training images of
the same sites, ``libauc_central.py``) sits beside them.

Federations: BreastMNIST with malignant (the file's label 0) as the positive, 4 sites, the
training positives per site cut to 1–2 %, 5 % or 10 % (``imratio``), or left as the file has
them (27 %, ``balanced``); and the synthetic federation with its findings cut to 2–10 %.

    python -m benchmarks.rare_positives.auc_vs_ce --seeds 0 1 2 3 4 --jobs 2 --libauc \\
        --markdown benchmarks/results/auc_vs_ce.md
    python -m benchmarks.rare_positives.auc_vs_ce --quick    # synthetic, tiny, 2 seeds, 2 rounds
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common.fragment import emit, provenance
from benchmarks.common.paths import BREASTMNIST as NPZ
from benchmarks.common.simulate import simulate
from benchmarks.common.stats import paired_ci

BASELINE = "FedAvg-CE"
LIBAUC = "LibAUC PESG, centralized"
# Contender -> the options that make it; all share the federation's recipe below.
ARMS: dict[str, list[str]] = {
    BASELINE: ["--algorithm", "fedavg"],
    "FedAvg-AUC": ["--algorithm", "fedavg", "--loss", "auc_margin"],
    "CODASCA": ["--algorithm", "codasca"],
    "CODA+": ["--algorithm", "coda_plus"],
    "Local SGDA": ["--algorithm", "local_sgda"],
    "Fed-Norm-SGDA+": ["--algorithm", "fed_norm_sgda_plus"],
    "FedSGDA-M (minibatch)": ["--algorithm", "fedsgda_mb"],
    "CODASCA, paper's α step": ["--algorithm", "codasca"],  # without the AUC recipe
}
# Backends whose α step is their own rule: they take the recentered head, not dual_lr.
OWN_DUAL_STEP = ("Fed-Norm-SGDA+", "FedSGDA-M (minibatch)")
# The recipe for image files and the synthetic demo's fast one. Cut down from the README's
# real-data recipe (small network, 10 + 60 rounds) to what 2 shared CPU cores allow. The lr
# of each was chosen on validation AUC (seeds 0–4, BENCHMARKS.md). BreastMNIST 5 %: FedAvg-CE
# 0.855 / 0.848 / 0.861 at lr 0.2 / 0.4 / 0.8; CODASCA with the AUC recipe 0.852 at 0.8.
# Synthetic, rare findings: FedAvg-CE 0.776 / 0.871 / 0.879 / 0.871 at lr 0.1 / 0.5 / 0.8 /
# 1.2; CODASCA 0.624 / 0.765 / 0.823 at 0.1 / 0.5 / 0.8 and 0.822 at 1.2 (α at the paper's η).
FILE_RECIPE = ["--model", "tiny", "--warmup-rounds", "5", "--rounds", "15", "--lr", "0.8"]
SYNTHETIC_RECIPE = ["--rounds", "20", "--lr", "0.8"]
QUICK_RECIPE = ["--rounds", "2", "--lr", "0.1"]
# What the AUC-loss contenders add (the min-max family; fedavg + AUC loss runs local SGDA):
# α's step scaled to the prevalence and, after a CE warm-up, the classifier's bias recentered.
AUC_RECIPE = ["--backend-option", "dual_lr=prevalence"]
AUC_FILE_RECIPE = ["--warmup-head", "recenter", *AUC_RECIPE]
WITHOUT_AUC_RECIPE = (BASELINE, "CODASCA, paper's α step")


def breast(partition: str, npz: Path) -> list[str]:
    return ["--data", f"medmnist:{npz}", "--positive-label", "0", "--sites", "4",
            "--partition", partition]  # fmt: skip


FEDERATIONS: dict[str, dict[str, Any]] = {
    "breast_2": {"title": "BreastMNIST, 1–2 % positives per site",
                 "data": lambda npz: breast("imratio:0.01,0.02,0.01,0.02", npz)},
    "breast_5": {"title": "BreastMNIST, 5 % positives per site",
                 "data": lambda npz: breast("imratio:0.05,0.05,0.05,0.05", npz)},
    "breast_10": {"title": "BreastMNIST, 10 % positives per site",
                  "data": lambda npz: breast("imratio:0.1,0.1,0.1,0.1", npz)},
    "breast_balanced": {"title": "BreastMNIST, balanced sites (iid, 27 % positives)",
                        "data": lambda npz: breast("iid", npz)},
    "synthetic_rare": {"title": "synthetic federation, findings at 2–10 % per site",
                       "data": lambda npz: ["--partition", "imratio:0.02,0.05,0.05,0.1"]},
}  # fmt: skip


def recipe(federation: str, quick: bool = False) -> list[str]:
    if quick:
        return QUICK_RECIPE
    return SYNTHETIC_RECIPE if federation.startswith("synthetic") else FILE_RECIPE


def arm_recipe(federation: str, arm: str, quick: bool = False) -> list[str]:
    """The AUC recipe of an AUC-loss contender (none for FedAvg-CE and the paper's step)."""
    synthetic = quick or federation.startswith("synthetic")  # no warm-up to recenter after
    if arm == BASELINE or (arm in WITHOUT_AUC_RECIPE and synthetic):
        return []
    if arm in WITHOUT_AUC_RECIPE:  # what image files now default to, undone
        return ["--warmup-head", "keep", "--backend-option", f"dual_lr={FILE_RECIPE[-1]}"]
    if arm in OWN_DUAL_STEP:
        return [] if synthetic else ["--warmup-head", "recenter"]
    return AUC_RECIPE if synthetic else AUC_FILE_RECIPE


def command(
    federation: str, arm: str, seed: int, runs: Path, npz: Path = NPZ, quick: bool = False,
    extra: list[str] | None = None,
) -> list[str]:  # fmt: skip
    """The ``fed-auc simulate`` command of one contender, federation and seed."""
    cli = [str(Path(sys.executable).parent / "fed-auc"), "--threads", "1", "simulate"]
    data = FEDERATIONS[federation]["data"](npz)
    options = [*recipe(federation, quick), *arm_recipe(federation, arm, quick), *(extra or [])]
    return [*cli, *data, *options, *ARMS[arm], "--seed", str(seed), "--json",
            "--runs-dir", str(runs)]  # fmt: skip


def run_one(cmd: list[str]) -> dict[str, float]:
    """Run one simulation; its validation and test AUC, wall time and load average."""
    start, load = time.perf_counter(), os.getloadavg()[0]
    summary, card = simulate(cmd)
    selected = card.get("selected") or []
    return {
        "val_auc": card["global_val_auc"],
        "test_auc": summary["exported_auc"],
        "seconds": time.perf_counter() - start,
        "load": load,
        # which stage made the export (a warm-up round, the run's own) and an early stop
        "exported_from": sorted({entry["stage"] for entry in selected}),
        "stopped_after": (card.get("stopped") or {}).get("round"),
    }


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else math.nan
    return f"{statistics.fmean(values):.3f} ± {sd:.3f}"


def table(title: str, results: dict[str, dict[int, dict]], baseline: str = BASELINE) -> str:
    """One federation: per contender mean ± sd of validation and test AUC, the paired test
    difference to the baseline with its 95 % CI, the seeds ahead, and per-seed test AUCs."""
    lines = [
        f"| {title} | validation AUC | test AUC | Δ test vs {baseline} [95 % CI] | ahead on "
        "| test AUC per seed |",
        "|---|---|---|---|---|---|",
    ]
    base = results.get(baseline, {})
    for name, by_seed in results.items():
        seeds = sorted(by_seed)
        row = [name, mean_sd([by_seed[s]["val_auc"] for s in seeds])]
        row.append(mean_sd([by_seed[s]["test_auc"] for s in seeds]))
        paired = [s for s in seeds if s in base]
        if name == baseline or not paired:
            row += ["—", "—"]
        else:
            diffs = [by_seed[s]["test_auc"] - base[s]["test_auc"] for s in paired]
            mean, lo, hi = paired_ci(diffs)
            row.append(f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]")
            row.append(f"{sum(d > 0 for d in diffs)} of {len(diffs)}")
        row.append(", ".join(f"{by_seed[s]['test_auc']:.3f}" for s in seeds))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def run_federation(
    federation: str, arms: list[str], seeds: list[int], jobs: int, runs: Path, npz: Path,
    quick: bool, extra: list[str],
) -> dict[str, dict[int, dict]]:  # fmt: skip
    """Every contender on every seed, at most ``jobs`` (≤ 2) simulations at a time."""
    results: dict[str, dict[int, dict]] = {arm: {} for arm in arms}
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, 2))) as pool:
        futures = {
            (arm, seed): pool.submit(
                run_one, command(federation, arm, seed, runs / federation, npz, quick, extra)
            )
            for seed in seeds
            for arm in arms
        }
        for (arm, seed), future in futures.items():
            results[arm][seed] = future.result()
            print(federation, arm, seed, results[arm][seed], file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--federations", nargs="+", choices=list(FEDERATIONS))
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--seeds", type=int, nargs="+", help="0 1 2 3 4 (0 1 under --quick)")
    parser.add_argument("--jobs", type=int, default=2, help="simulations at a time (at most 2)")
    parser.add_argument("--npz", type=Path, default=NPZ, help="BreastMNIST .npz")
    parser.add_argument("--quick", action="store_true", help="synthetic only, 2 rounds, 2 seeds")
    parser.add_argument("--libauc", action="store_true", help="add centralized LibAUC runs")
    parser.add_argument(
        "--extra", nargs=argparse.REMAINDER, default=[],
        help="further simulate options for every run (a recipe under test)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write every run's numbers here")
    parser.add_argument(
        "--from-json", type=Path, nargs="+",
        help="print the tables of earlier --json files (merged in order) instead of running",
    )  # fmt: skip
    parser.add_argument("--markdown", type=Path, help="also write the tables here")
    args = parser.parse_args(argv)
    seeds = args.seeds or ([0, 1] if args.quick else [0, 1, 2, 3, 4])
    federations = args.federations or (["synthetic_rare"] if args.quick else list(FEDERATIONS))
    runs = Path(tempfile.mkdtemp(prefix="auc_vs_ce_"))
    start = time.perf_counter()
    everything = merged(args.from_json) if args.from_json else {}
    for federation in [] if args.from_json else federations:
        results = run_federation(
            federation, args.arms, seeds, args.jobs, runs, args.npz, args.quick, args.extra
        )
        if args.libauc and federation.startswith("breast"):
            results[LIBAUC] = central_runs(args.npz, federation, seeds, args.jobs)
        everything[federation] = results
    sections = [
        fragment_section(federation, results, args.quick, args.extra)
        for federation, results in everything.items()
    ]
    if args.json is not None:
        args.json.write_text(json.dumps(everything, indent=1))
    settings = (
        f"Recipe: image files `{' '.join(FILE_RECIPE)}`, synthetic `{' '.join(SYNTHETIC_RECIPE)}`"
        if not args.quick
        else f"Quick: `{' '.join(QUICK_RECIPE)}`"
    )
    if args.from_json:  # the seeds the files hold, not the ones a run would use
        held = {s for arms in everything.values() for runs in arms.values() for s in runs}
        seeds = sorted(held)
    head = provenance(" ".join(map(str, seeds)), time.perf_counter() - start, settings + ".")
    emit("\n\n".join([head, *sections]) + "\n", args.markdown)


def merged(paths: list[Path]) -> dict[str, dict[str, dict[int, dict]]]:
    """The results of several ``--json`` files, federation by federation and contender by
    contender (later files add seeds and contenders); seeds become ints again."""
    out: dict[str, dict[str, dict[int, dict]]] = {}
    for path in paths:
        for federation, arms in json.loads(path.read_text()).items():
            for arm, by_seed in arms.items():
                runs = {int(seed): r for seed, r in by_seed.items()}
                out.setdefault(federation, {}).setdefault(arm, {}).update(runs)
    return out


def central_runs(npz: Path, federation: str, seeds: list[int], jobs: int) -> dict[int, dict]:
    """LibAUC centralized on the federation's pooled images, one process per seed (≤ 2)."""
    from benchmarks.anchors.libauc_central import run_central

    partition = federation_partition(federation)
    with ProcessPoolExecutor(max_workers=max(1, min(jobs, 2))) as pool:
        futures = {seed: pool.submit(run_central, npz, partition, seed) for seed in seeds}
        return {seed: future.result() for seed, future in futures.items()}


def federation_partition(federation: str) -> str:
    """The ``--partition`` of a BreastMNIST federation (for the centralized LibAUC run)."""
    data = FEDERATIONS[federation]["data"](NPZ)
    return data[data.index("--partition") + 1]


def fragment_section(
    federation: str, results: dict[str, dict[int, dict]], quick: bool, extra: list[str]
) -> str:
    runs = [r for by_seed in results.values() for r in by_seed.values() if "seconds" in r]
    minutes = sum(r["seconds"] for r in runs) / 60
    loads = [r["load"] for r in runs]
    note = (
        f"{len(runs)} runs, {minutes:.0f} run-minutes; load average (1 min) "
        f"{min(loads):.1f}–{max(loads):.1f} at their starts"
    )
    text = f"`{' '.join(recipe(federation, quick) + extra)}`"
    auc = " ".join(arm_recipe(federation, "CODASCA", quick))
    if auc:
        text += f"; the AUC-loss contenders add `{auc}`"
    own = [arm for arm in OWN_DUAL_STEP if arm in results]
    own_recipe = " ".join(arm_recipe(federation, own[0], quick)) if own else auc
    if own_recipe != auc:
        text += f" ({', '.join(own)}: " + (f"`{own_recipe}`)" if own_recipe else "nothing)")
    return (
        f"#### {FEDERATIONS[federation]['title']}\n\n{text}; {note}.\n\n"
        + table(FEDERATIONS[federation]["title"], results)
        + export_note(results)
    )


def export_note(results: dict[str, dict[int, dict]]) -> str:
    """Per contender, how many seeds exported a warm-up model and stopped early (only runs
    that recorded it: the whole-run export and ``--early-stop`` date from 2026-11-29)."""
    parts = []
    for name, by_seed in results.items():
        known = [r for r in by_seed.values() if "exported_from" in r]
        if not known:
            continue
        warm = sum("warm-up" in r["exported_from"] for r in known)
        stops = sorted(r["stopped_after"] for r in known if r["stopped_after"] is not None)
        stopped = f", stopped early on {len(stops)} (after rounds {stops})" if stops else ""
        parts.append(f"{name}: exported a warm-up model on {warm} of {len(known)}{stopped}")
    return "\n\n" + "; ".join(parts) + "." if parts else ""


if __name__ == "__main__":
    main()
