"""On a GPU: fed-auc's local step vs a plain PyTorch loop, and one CODASCA round over Flower.

Table 1 (in this process): DenseNet121 at 224 px, batch 32, in fp32 and bf16. A real
``Node.train`` (codasca: the broadcast moved to the device, local steps under autocast,
control variates, the reply and local state back to the CPU, pending state written to disk)
and a plain loop (the same model and loss on the same device and autocast, ``torch.optim.SGD``,
batches from the same sampler moved to the device) train the same steps, interleaved round by
round; the ratio is the median of per-round time ratios (fed-auc ÷ plain; target ≤ 1.05).
Table 2: one 3-site CODASCA federation over Flower on this machine (``flower_overhead``'s
SuperLink and three ``fed-auc node`` processes on loopback, each site file with this device
and precision): per round its wall time, the slowest node's compute and the overhead.

    python -m benchmarks.systems.gpu_step --markdown benchmarks/results/gpu_step.md
    python -m benchmarks.systems.gpu_step --smoke --device cpu   # tiny settings, any machine
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from benchmarks.common.alternate import alternate_rounds
from benchmarks.common.fragment import emit, provenance
from benchmarks.systems import flower_overhead
from fed_auc.algorithms import build_backend
from fed_auc.data.sampling import BatchStream
from fed_auc.data.synthetic import SiteProfile, make_site
from fed_auc.losses import build_loss
from fed_auc.models import build_model
from fed_auc.node.compute import Compute
from fed_auc.node.node import LocalTraining, Node


@dataclass(frozen=True)
class Settings:
    model: str = "densenet121"
    image_size: int = 224
    batch: int = 32
    steps: int = 8  # local steps per round
    rounds: int = 5  # timed rounds, after one warm-up round each side
    precisions: tuple[str, ...] = ("fp32", "bf16")
    flower_image_size: int = 224
    flower_rounds: int = 2
    flower_scale: float = 0.3  # the demo hospitals' splits × this
    seed: int = 0


SMOKE = Settings(
    model="tiny", image_size=32, batch=8, steps=2, rounds=2, flower_image_size=32,
    flower_rounds=1, flower_scale=0.15,
)  # fmt: skip


class PlainLoop:
    """The baseline on the device: what one would write by hand for this model and loss."""

    def __init__(self, settings: Settings, site, pos_ratio: float, compute: Compute) -> None:
        self.compute = compute
        self.model = build_model(settings.model).to(compute.device)
        self.loss = build_loss("auc_margin", 1, [pos_ratio]).to(compute.device)
        params = [*self.model.parameters(), self.loss.a, self.loss.b, self.loss.alpha]
        self.optimizer = torch.optim.SGD(params, lr=0.1, weight_decay=1e-5)
        self.batches = BatchStream(site.train, settings.batch, seed=settings.seed)

    def steps(self, n: int) -> None:
        self.model.train()
        device = self.compute.device
        for _ in range(n):
            x, y, _ = next(self.batches)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            self.optimizer.zero_grad(set_to_none=True)
            with self.compute.autocast():
                logits = self.model(x)
            self.loss(logits.float(), y).backward()
            torch.nn.utils.clip_grad_value_(self.model.parameters(), 1.0)
            self.loss.alpha.grad.neg_()  # ascent on α
            self.optimizer.step()
            with torch.no_grad():
                self.loss.alpha.clamp_(min=0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def step_vs_plain(settings: Settings, compute: Compute) -> dict:
    """Images/s of a node (codasca) and the plain loop on ``compute``, alternating."""
    size, batch, steps = settings.image_size, settings.batch, settings.steps
    profile = SiteProfile("bench", max(4 * batch, 16), 2, 2, 0.2)
    site = make_site(profile, image_size=size, seed=settings.seed)
    p = site.train.positives()[0] / len(site.train)
    plain = PlainLoop(settings, site, p, compute)
    backend = build_backend("codasca", local_steps=steps, seed=settings.seed)
    with tempfile.TemporaryDirectory() as state_dir:
        training = LocalTraining(
            plain.model.config(), "auc_margin", batch_size=batch, seed=settings.seed
        )
        node = Node(site, backend, training, state_dir, compute=compute)
        node_rates, plain_rates, peaks = alternate_rounds(
            node, backend, plain.steps, p, settings.rounds, steps, batch
        )
    ratios = [p / n for n, p in zip(node_rates, plain_rates, strict=True)]  # time node / plain
    return {
        "precision": compute.precision, "device": str(compute.device),
        "node": statistics.median(node_rates), "plain": statistics.median(plain_rates),
        "time_ratio": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
        "device_peak_mib": max((x for x in peaks if x is not None), default=None),
    }  # fmt: skip


def flower_round(settings: Settings, compute: Compute, work: Path) -> dict:
    """One 3-site CODASCA federation over Flower, every node on ``compute``: mean round s,
    slowest node's compute s and overhead s (``flower_overhead``'s definitions)."""
    options = {
        "algorithm": "codasca", "rounds": settings.flower_rounds, "local_steps": settings.steps,
        "model": settings.model, "image_size": settings.flower_image_size,
        "batch_size": settings.batch, "data_scale": settings.flower_scale, "seed": settings.seed,
    }  # fmt: skip
    node = {"device": str(compute.device), "precision": compute.precision}
    results = flower_overhead.measure(options, ["flower"], work, node)
    means = flower_overhead.summarize(results)
    if "flower" not in means:
        return {"failed": results["flower"].get("failed", "no rounds")}
    return {k: means["flower"][k] for k in ("s", "compute", "overhead")}


def table(steps: list[dict], flower: dict | None, settings: Settings) -> str:
    lines = [
        "| precision | device | fed-auc img/s | plain img/s | time ratio (range) "
        "| device peak MiB |",
        "|---|---|---|---|---|---|",
    ]
    for r in steps:
        peak = "—" if r["device_peak_mib"] is None else f"{r['device_peak_mib']:.0f}"
        lo, hi = r["ratio_range"]
        lines.append(
            f"| {r['precision']} | {r['device']} | {r['node']:.1f} | {r['plain']:.1f} "
            f"| {r['time_ratio']:.2f} ({lo:.2f}–{hi:.2f}) | {peak} |"
        )
    if flower is not None:
        lines += [
            "",
            "| Flower, 3 sites, CODASCA | round s | slowest node compute s | overhead s |",
            "|---|---|---|---|",
        ]
        if "failed" in flower:
            lines.append(f"| {settings.model} @ {settings.flower_image_size} px | failed: "
                         f"{flower['failed']} | | |")  # fmt: skip
        else:
            lines.append(
                f"| {settings.model} @ {settings.flower_image_size} px, "
                f"{settings.flower_rounds} round(s) | {flower['s']:.1f} | {flower['compute']:.1f} "
                f"| {flower['overhead']:.1f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model at 32 px (any machine)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (auto)")
    parser.add_argument("--precisions", help="comma-separated (default fp32,bf16)")
    parser.add_argument("--rounds", type=int, help="timed rounds per precision")
    parser.add_argument("--no-flower", action="store_true", help="only the local-step table")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    parser.add_argument("--work-dir", type=Path, help="keep the Flower run's logs here")
    parser.add_argument("--markdown", type=Path, help="write the fragment here (Markdown)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    settings = SMOKE if args.smoke else Settings()
    if args.precisions:
        settings = replace(settings, precisions=tuple(args.precisions.split(",")))
    if args.rounds:
        settings = replace(settings, rounds=args.rounds)
    start = time.perf_counter()
    steps = [step_vs_plain(settings, Compute.of(args.device, p)) for p in settings.precisions]
    flower = None
    if not args.no_flower:
        compute = Compute.of(args.device, settings.precisions[-1])
        with tempfile.TemporaryDirectory() as tmp:
            flower = flower_round(settings, compute, args.work_dir or Path(tmp))
    text = table(steps, flower, settings)
    where = (
        f"{settings.model} at {settings.image_size} px, batch {settings.batch}, "
        f"{settings.steps} steps per round, {settings.rounds} timed rounds per precision"
    )
    emit(provenance(str(settings.seed), time.perf_counter() - start, where) + "\n\n" + text,
         args.markdown)  # fmt: skip
    return {"steps": steps, "flower": flower}


if __name__ == "__main__":
    main()
