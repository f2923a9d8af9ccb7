"""Partial model training and personalization, measured (BENCHMARKS.md, last section).

1. ``memory``: measured training-step memory per split point (activations autograd saves,
   plus weights, gradients and CODASCA's per-tensor state of the trained part) for
   DenseNet121 at 32 and 64 px and the tiny DenseNet, batch 32.
2. ``partial``: one seed, the same synthetic federation: every site strong; strong, moderate
   (40 %) and weak (15 %) sites with partial training; and the same with the weak site, or
   every non-strong site, left out of training (still evaluated).
3. ``personal``: per-site test AUC of the global model (plain CODASCA) and of each site's
   personal model (``--personalize head`` and ``l2``) on the heterogeneous federation.

Without parts, all three. ``--quick``: the memory table of the tiny DenseNet and DenseNet121
at 32 px only, and 4 rounds at data_scale 0.3 for the partial and personal tables.

    python -m benchmarks.claims.partial_and_personal --quick
    python -m benchmarks.claims.partial_and_personal memory
    python -m benchmarks.claims.partial_and_personal partial personal --rounds 20
    python -m benchmarks.claims.partial_and_personal \\
        --markdown benchmarks/results/partial_and_personal.md
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import fed_auc.coordinator.loop as coordinator_module
from benchmarks.common.fragment import emit, provenance
from fed_auc.algorithms.partial import memory_table
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.simulation import run_simulation

MEMORY_CASES = [("densenet121", 32), ("densenet121", 64), ("tiny", 28)]
QUICK_MEMORY_CASES = [("densenet121", 32), ("tiny", 28)]
BUDGETS = [1.0, 1.0, 0.4, 0.15]  # the four default sites: two strong, moderate, weak


def memory_section(batch: int, cases: Sequence[tuple[str, int]] = MEMORY_CASES) -> str:
    lines = []
    for arch, size in cases:
        config = {"arch": arch, "num_labels": 1, "in_channels": 1}
        table = memory_table(config, batch, size)
        full = table[0].total
        lines += [
            f"\n{arch}, {size} px, batch {batch} (MB = 10^6 bytes):\n",
            "| trains from | groups | activations MB | weights MB | total MB | of full step |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for row in table:
            lines.append(
                f"| {row.groups[0]} | {len(row.groups)} | {row.activations / 1e6:.2f} | "
                f"{row.weights / 1e6:.2f} | {row.total / 1e6:.2f} | {row.total / full:.3f} |"
            )
    return "\n".join(lines)


def _run(excluded: Sequence[str] = (), **options: Any) -> dict[str, Any]:
    """One simulated run; sites in ``excluded`` never train but are still evaluated."""
    sample = coordinator_module.sample_sites

    def without(sites, *args, **kwargs):
        return sample([s for s in sites if s not in excluded], *args, **kwargs)

    coordinator_module.sample_sites = without
    try:
        with tempfile.TemporaryDirectory() as runs:
            return run_simulation(ExperimentConfig(runs_dir=runs, **options))
    finally:
        coordinator_module.sample_sites = sample


def partial_section(base: dict[str, Any], plain: dict[str, Any]) -> str:
    """``plain``: the summary of the run with ``base`` and every site strong."""
    mixed = {**base, "partial_training": True, "site_memory": BUDGETS}
    first = _run(**mixed)
    groups = first["trained_groups"]
    sites = sorted(groups, key=lambda s: -len(groups[s]))  # strong first, weak last
    weak = [s for s in sites if len(groups[s]) == len(groups[sites[-1]])]
    non_strong = [s for s in sites if len(groups[s]) < len(groups[sites[0]])]
    runs = [
        ("all four sites strong (plain CODASCA)", plain),
        ("strong, strong, moderate 40 %, weak 15 % (partial training)", first),
        (f"mixed, weak site ({', '.join(weak)}) left out of training", _run(weak, **mixed)),
        ("only the two strong sites train", _run(non_strong, **mixed)),
    ]
    lines = [
        "Trained groups per site: "
        + "; ".join(f"{s}: {groups[s][0]}→classifier ({len(groups[s])})" for s in sites),
        "",
        "| federation | pooled test AUC | worst site | " + " | ".join(sites) + " |",
        "|---|---:|---:|" + "---:|" * len(sites),
    ]
    for name, summary in runs:
        per_site = " | ".join(f"{summary['site_auc'][s]:.3f}" for s in sites)
        lines.append(
            f"| {name} | {summary['global_auc'][-1]:.3f} | "
            f"{summary['worst_site_auc'][-1]:.3f} | {per_site} |"
        )
    return "\n".join(lines)


def personal_section(base: dict[str, Any], plain: dict[str, Any]) -> str:
    """``plain``: the summary of the run with ``base`` (the global model's row)."""
    head = _run(**base, personalize="head")
    l2 = _run(**base, personalize="l2", personal_lambda=1.0)
    sites = list(plain["site_auc"])
    rows = [
        ("global model (plain CODASCA)", plain["site_auc"]),
        ("global backbone + initial head (head run)", head["site_auc"]),
        ("personal head (LSGD-PFL, lr ratio = 4 sites)", head["site_personal_auc"]),
        ("global model (l2 run)", l2["site_auc"]),
        ("personal model, l2, λ = 1", l2["site_personal_auc"]),
    ]
    lines = [
        "| model | " + " | ".join(sites) + " | mean | worst |",
        "|---|" + "---:|" * (len(sites) + 2),
    ]
    for name, aucs in rows:
        values = [aucs[s] for s in sites]
        cells = " | ".join(f"{v:.3f}" for v in values)
        lines.append(f"| {name} | {cells} | {sum(values) / len(values):.3f} | {min(values):.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", help="memory, partial, personal (default: all)")
    parser.add_argument("--quick", action="store_true", help="fewer memory cases and rounds")
    parser.add_argument("--rounds", type=int, help="rounds per run (full: 20, quick: 4)")
    parser.add_argument("--data-scale", type=float, help="(full: 0.5, quick: 0.3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--markdown", type=Path, help="write the tables to this file")
    args = parser.parse_args()
    rounds = args.rounds or (4 if args.quick else 20)
    data_scale = args.data_scale or (0.3 if args.quick else 0.5)
    base = {"rounds": rounds, "data_scale": data_scale, "seed": args.seed}
    base["decay_every"] = rounds * 8  # one stage: no lr decay within the short run
    runs = (
        "Tiny DenseNet, the four default synthetic sites at data_scale "
        f"{data_scale}, CODASCA, 8 local steps, batch 32, {rounds} rounds, no lr decay; "
        "test AUC after the last round."
    )
    plain: dict[str, Any] = {}  # the plain run, shared by the partial and personal tables

    def plain_run() -> dict[str, Any]:
        if not plain:
            plain.update(_run(**base))
        return plain

    cases = QUICK_MEMORY_CASES if args.quick else MEMORY_CASES
    sections: dict[str, tuple[str, Callable[[], str]]] = {
        "memory": ("One training step per split point.", lambda: memory_section(args.batch, cases)),
        "partial": (f"{runs} Budgets {BUDGETS}.", lambda: partial_section(base, plain_run())),
        "personal": (runs, lambda: personal_section(base, plain_run())),
    }
    unknown = sorted(set(args.parts) - set(sections))
    if unknown:  # argparse's choices reject an empty list of parts, so checked here
        parser.error(f"unknown part(s) {unknown}: choose from {list(sections)}")
    fragments = []
    for part in args.parts or list(sections):
        settings, build = sections[part]
        started = time.perf_counter()
        table = build()
        line = provenance(str(args.seed), time.perf_counter() - started, settings)
        fragments.append(f"{line}\n\n{table.strip()}\n")
    emit("\n".join(fragments), args.markdown)


if __name__ == "__main__":
    main()
