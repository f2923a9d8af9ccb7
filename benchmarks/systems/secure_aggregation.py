"""Secure aggregation's cost per round against plain aggregation, side by side, in-process.

Two federations of the same experiment in this process, one with ``secure_aggregation``:
rounds alternate between them (training included, evaluation skipped), so both see the same
machine load. Reported per row: median seconds per round of each and the median of per-round
ratios (range), and the bytes per site and round each way: plain replies are float32 tensors;
a secure reply is one uint64 word per value plus per-tensor weights, and the protocol adds
keys and encrypted shares (JSON) in both directions.

    python -m benchmarks.systems.secure_aggregation --quick
    python -m benchmarks.systems.secure_aggregation \\
        --markdown benchmarks/results/secure_aggregation.md
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.fragment import emit, provenance
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.simulation import build_federation

HEADER = (
    "| backend | model | round | plain s/round | secure s/round | time ratio "
    "| plain MB up/down per site | secure MB up/down per site | of which protocol kB |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


@dataclass(frozen=True)
class Row:
    algorithm: str
    model: str
    image_size: int
    sites: int
    local_steps: int
    rounds: int
    quick_rounds: int


ROWS = (
    Row("codasca", "tiny", 28, sites=3, local_steps=8, rounds=12, quick_rounds=2),
    Row("fedavg", "tiny", 28, sites=3, local_steps=8, rounds=12, quick_rounds=2),
    Row("codasca", "densenet121", 32, sites=3, local_steps=8, rounds=4, quick_rounds=1),
)


def measure(config: ExperimentConfig, rounds: int) -> dict[str, Any]:
    """Seconds and bytes per round of both federations, rounds alternating."""
    feds = {
        secure: build_federation(
            ExperimentConfig(
                **{
                    **config.to_dict(),
                    "secure_aggregation": secure,
                    "runs_dir": str(Path(config.runs_dir) / str(secure)),
                }
            )
        )  # fmt: skip
        for secure in (False, True)
    }
    times: dict[bool, list[float]] = {False: [], True: []}
    traffic: dict[bool, dict[str, float]] = {}
    for fed in feds.values():
        fed.coordinator.evaluate_initial()
    for r in range(rounds + 1):  # round 0 of each is a warm-up
        for secure, fed in feds.items():
            start = time.perf_counter()
            record = fed.coordinator.run_round(evaluate=False)
            elapsed = time.perf_counter() - start
            if r == 0:
                continue
            times[secure].append(elapsed)
            sites = len(record.sites)
            protocol = sum(
                sum(s.metrics.get("secure_aggregation_bytes", {}).get("train", {}).values())
                for s in record.sites
            )
            traffic[secure] = {
                "up": record.bytes_up / sites,
                "down": record.bytes_down / sites,
                "protocol": protocol / sites,
            }
    for fed in feds.values():
        fed.coordinator.close()
        fed.store.close()
    ratios = [s / p for s, p in zip(times[True], times[False], strict=True)]
    return {
        "plain_s": statistics.median(times[False]),
        "secure_s": statistics.median(times[True]),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratios": ratios,
        "plain_bytes": traffic[False],
        "secure_bytes": traffic[True],
    }


def table_row(config: ExperimentConfig, rounds: int, result: dict[str, Any]) -> str:
    plain, secure = result["plain_bytes"], result["secure_bytes"]
    return (
        f"| {config.algorithm} | {config.model} @ {config.image_size} px | {rounds} rounds, "
        f"{config.sites} × {config.local_steps} steps, batch {config.batch_size} "
        f"| {result['plain_s']:.3f} | {result['secure_s']:.3f} "
        f"| **{result['ratio']:.2f}** ({result['ratio_min']:.2f}–{result['ratio_max']:.2f}) "
        f"| {plain['up'] / 1e6:.3f} / {plain['down'] / 1e6:.3f} "
        f"| {secure['up'] / 1e6:.3f} / {secure['down'] / 1e6:.3f} "
        f"| {secure['protocol'] / 1e3:.1f} |"
    )


def run(rows: tuple[Row, ...], quick: bool, runs_dir: str, **overrides: Any) -> str:
    lines = [HEADER]
    for row in rows:
        rounds = row.quick_rounds if quick else row.rounds
        config = ExperimentConfig(
            algorithm=row.algorithm,
            model=row.model,
            image_size=row.image_size,
            sites=row.sites,
            local_steps=row.local_steps,
            rounds=rounds + 1,
            runs_dir=str(Path(runs_dir) / f"{row.algorithm}-{row.model}"),
            **overrides,
        )
        lines.append(table_row(config, rounds, measure(config, rounds)))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one or two rounds per row")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--data-scale", type=float, default=0.3)
    parser.add_argument("--markdown", type=Path, help="write the table fragment here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as runs_dir:
        table = run(ROWS, args.quick, runs_dir, data_scale=args.data_scale)
    settings = f"data_scale {args.data_scale}, {args.threads} torch thread(s), evaluation skipped"
    emit(provenance("0", time.perf_counter() - start, settings) + "\n\n" + table, args.markdown)


if __name__ == "__main__":
    main()
