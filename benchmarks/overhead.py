"""Time per local training step: ``fed-auc simulate`` vs. a plain PyTorch loop, side by side.

Both run in this process on the same model architecture, batch size and data. Rounds
alternate: one fed-auc round (every node trains, the coordinator validates, aggregates,
records the round in SQLite and checkpoints; the evaluation pass is subtracted), then the
same number of steps of a plain loop — forward, AUC-margin loss, backward, gradient clipping,
``torch.optim.SGD`` step with weight decay, gradient ascent and projection for α. The ratio of
per-step times is the overhead of the federated machinery (target ≤ 1.10).

    python benchmarks/overhead.py --model tiny --image-size 28
    python benchmarks/overhead.py --model densenet121 --image-size 64 --rounds 4
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from fed_auc.data.sampling import BatchStream
from fed_auc.losses import build_loss
from fed_auc.models import build_model
from fed_auc.simulation import SimulationConfig, build_federation


class PlainLoop:
    """The baseline: what one would write by hand to train this model with this loss."""

    def __init__(self, config: SimulationConfig, split, pos_ratio: list[float]) -> None:
        self.model = build_model(config.model, num_labels=config.num_labels)
        self.loss = build_loss(config.loss, config.num_labels, pos_ratio)
        self.clip = config.grad_clip
        params = [*self.model.parameters(), self.loss.a, self.loss.b, self.loss.alpha]
        self.optimizer = torch.optim.SGD(params, lr=config.lr, weight_decay=config.weight_decay)
        self.batches = BatchStream(split, config.batch_size, seed=config.seed)

    def steps(self, n: int) -> None:
        self.model.train()
        for _ in range(n):
            x, y = next(self.batches)
            self.optimizer.zero_grad(set_to_none=True)
            self.loss(self.model(x), y).backward()
            torch.nn.utils.clip_grad_value_(self.model.parameters(), self.clip)
            self.loss.alpha.grad.neg_()  # ascent on α
            self.optimizer.step()
            with torch.no_grad():
                self.loss.alpha.clamp_(min=0)


def measure(config: SimulationConfig, rounds: int) -> dict[str, float]:
    fed = build_federation(config)
    coordinator = fed.coordinator
    plain = PlainLoop(config, fed.sites[0].train, coordinator.pos_ratio)
    coordinator.evaluate_initial()
    fed_times, plain_times = [], []
    for r in range(rounds + 1):  # round 0 of each side is a warm-up
        start = time.perf_counter()
        record = coordinator.run_round()
        fed_s = time.perf_counter() - start - record.metrics["eval_s"]
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
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", default="codasca")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--local-steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as runs_dir:
        config = SimulationConfig(
            algorithm=args.algorithm,
            model=args.model,
            image_size=args.image_size,
            sites=args.sites,
            local_steps=args.local_steps,
            batch_size=args.batch_size,
            runs_dir=runs_dir,
        )
        result = measure(config, args.rounds)
    print(
        f"| {args.algorithm} | {args.model} @ {args.image_size} px | {args.sites} × "
        f"{args.local_steps} steps, batch {args.batch_size} | {args.threads} | "
        f"{result['fed_ms']:.1f} | {result['plain_ms']:.1f} | **{result['ratio']:.3f}** "
        f"({result['ratio_min']:.3f}–{result['ratio_max']:.3f}) |"
    )


if __name__ == "__main__":
    main()
