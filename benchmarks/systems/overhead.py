"""Time per local training step: ``fed-auc simulate`` vs. a plain PyTorch loop, side by side.

Both run in this process on the same model architecture, batch size and data. Rounds
alternate: one fed-auc round (every node trains, the coordinator validates, aggregates,
records the round in SQLite and checkpoints; rounds skip the evaluation pass), then the
same number of steps of a plain loop — forward, AUC-margin loss, backward, gradient clipping,
``torch.optim.SGD`` step with weight decay, gradient ascent and projection for α. The ratio of
per-step times is the overhead of the federated machinery (target ≤ 1.10).

One invocation measures every row of the table (ROWS): the tiny DenseNet with CODASCA and with
local SGDA, and DenseNet121 with CODASCA. ``--quick`` runs fewer rounds and DenseNet121 at 32 px.

    python -m benchmarks.systems.overhead --quick
    python -m benchmarks.systems.overhead --markdown benchmarks/results/overhead.md
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
from fed_auc.data.sampling import BatchStream
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.losses import build_loss
from fed_auc.models import build_model
from fed_auc.simulation import build_federation


class PlainLoop:
    """The baseline: what one would write by hand to train this model with this loss."""

    def __init__(self, config: ExperimentConfig, split, pos_ratio: list[float]) -> None:
        self.model = build_model(config.model, num_labels=config.num_labels)
        self.loss = build_loss(config.loss, config.num_labels, pos_ratio)
        self.clip = config.grad_clip
        params = [*self.model.parameters(), self.loss.a, self.loss.b, self.loss.alpha]
        self.optimizer = torch.optim.SGD(params, lr=config.lr, weight_decay=config.weight_decay)
        self.batches = BatchStream(split, config.batch_size, seed=config.seed)

    def steps(self, n: int) -> None:
        self.model.train()
        for _ in range(n):
            x, y, _ = next(self.batches)
            self.optimizer.zero_grad(set_to_none=True)
            self.loss(self.model(x), y).backward()
            torch.nn.utils.clip_grad_value_(self.model.parameters(), self.clip)
            self.loss.alpha.grad.neg_()  # ascent on α
            self.optimizer.step()
            with torch.no_grad():
                self.loss.alpha.clamp_(min=0)


@dataclass(frozen=True)
class Row:
    """One row of the table: a federation and how many rounds to time (full, quick)."""

    algorithm: str
    model: str
    image_size: int
    sites: int
    rounds: int
    quick_rounds: int
    quick_image_size: int | None = None


ROWS = (
    Row("codasca", "tiny", 28, sites=4, rounds=30, quick_rounds=6),
    Row("local_sgda", "tiny", 28, sites=4, rounds=30, quick_rounds=6),
    Row("codasca", "densenet121", 64, sites=2, rounds=8, quick_rounds=2, quick_image_size=32),
)


def measure(config: ExperimentConfig, rounds: int) -> dict[str, Any]:
    """Median ms per step of both sides and the median of per-round ratios (and its range)."""
    fed = build_federation(config)
    coordinator = fed.coordinator
    plain = PlainLoop(config, fed.sites[0].train, coordinator.pos_ratio)
    coordinator.evaluate_initial()
    fed_times, plain_times = [], []
    for r in range(rounds + 1):  # round 0 of each side is a warm-up
        start = time.perf_counter()
        record = coordinator.run_round(evaluate=False)  # evaluation is not training overhead
        fed_s = time.perf_counter() - start
        steps = sum(site.steps or 0 for site in record.sites)
        start = time.perf_counter()
        plain.steps(steps)
        plain_s = time.perf_counter() - start
        if r > 0:
            fed_times.append(fed_s / steps)
            plain_times.append(plain_s / steps)
    coordinator.close()
    fed.store.close()
    ratios = [f / p for f, p in zip(fed_times, plain_times, strict=True)]
    return {
        "fed_ms": 1000 * statistics.median(fed_times),
        "plain_ms": 1000 * statistics.median(plain_times),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratios": ratios,
    }


def table_row(config: ExperimentConfig, rounds: int, result: dict[str, Any]) -> str:
    return (
        f"| {config.algorithm} | {config.model} @ {config.image_size} px | {rounds} rounds, "
        f"{config.sites} × {config.local_steps} steps, batch {config.batch_size} "
        f"| {torch.get_num_threads()} | {result['fed_ms']:.1f} | {result['plain_ms']:.1f} "
        f"| **{result['ratio']:.3f}** ({result['ratio_min']:.3f}–{result['ratio_max']:.3f}) |"
    )


HEADER = (
    "| backend | model | timed rounds × sites × steps | threads | fed-auc ms/step "
    "| plain ms/step | ratio (median of per-round ratios, range) |\n|---|---|---|---|---|---|---|"
)


def run(rows: tuple[Row, ...], quick: bool, runs_dir: str, **fixed) -> str:
    """Measure every row, side by side in this process; the Markdown table."""
    lines = [HEADER]
    for i, row in enumerate(rows):
        config = ExperimentConfig(
            algorithm=row.algorithm,
            model=row.model,
            image_size=(row.quick_image_size or row.image_size) if quick else row.image_size,
            sites=row.sites,
            runs_dir=f"{runs_dir}/{i}",
            **fixed,
        )
        rounds = row.quick_rounds if quick else row.rounds
        lines.append(table_row(config, rounds, measure(config, rounds)))
        print(lines[-1], flush=True)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, DenseNet121 @ 32 px")
    parser.add_argument("--local-steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--markdown", type=Path, help="write the table to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as runs_dir:
        text = run(
            ROWS, args.quick, runs_dir, local_steps=args.local_steps, batch_size=args.batch_size
        )
    settings = (
        "Synthetic hospitals, seed 0; each side's first round is a warm-up, then rounds "
        "alternate between fed-auc and the plain loop; timed rounds skip the evaluation pass."
    )
    emit(f"{provenance('0', time.perf_counter() - started, settings)}\n\n{text}", args.markdown)


if __name__ == "__main__":
    main()
