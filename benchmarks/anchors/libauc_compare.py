"""fed-auc's AUC-margin loss and min-max step vs LibAUC's AUCMLoss + PESG, one site, one run.

Every contender starts from the same initial weights and draws the same batches (same
``BatchStream`` seed) from one imbalanced synthetic site. Training is interleaved in chunks
(each chunk every contender runs ``chunk_steps`` steps, order rotated per chunk), so load from
other processes hits all of them alike; images/s is reported as the median over chunks with
its range, and the cost relative to plain SGD + BCE as the median of the per-chunk ratios.
fed-auc trains the way a node does: its backend's ``plan`` → ``client_update`` →
``aggregate`` with one site and ``local_steps = chunk_steps``.

LibAUC is never a dependency of fed-auc: it is installed (``--no-deps``) into
``benchmarks/.libauc`` on first use and imported from there by path (``sys.path`` untouched).

    python -m benchmarks.anchors.libauc_compare --quick \\
        --markdown benchmarks/results/libauc_compare.md
    python -m benchmarks.anchors.libauc_compare   # DenseNet121 @ 32 px, batch 128, 2 threads
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from sklearn.metrics import roc_auc_score
from torch import nn

from benchmarks.common.fragment import command_line, emit
from benchmarks.common.machine import describe
from benchmarks.common.paths import ROOT
from fed_auc.algorithms import build_backend
from fed_auc.algorithms.sgda import StepRule, sgda_step
from fed_auc.data.base import Split
from fed_auc.data.sampling import BatchStream
from fed_auc.data.synthetic import SiteProfile, make_site
from fed_auc.losses import AUCMarginLoss
from fed_auc.models import build_model
from fed_auc.trainable import Trainable

LIBAUC_DIR = ROOT / "benchmarks" / ".libauc"
LIBAUC_VERSION = "2.0.1"
BASELINE = "SGD + BCE"


@dataclass(frozen=True)
class Settings:
    model: str = "densenet121"
    image_size: int = 32
    batch_size: int = 128
    chunks: int = 8
    chunk_steps: int = 16
    n_train: int = 3000
    n_test: int = 1000
    imratio: float = 0.1
    lr: float = 0.1
    weight_decay: float = 1e-5
    grad_clip: float = 1.0
    margin: float = 1.0
    gamma: float = 1 / 500  # CODASCA's proximal weight = PESG's default epoch_decay
    threads: int = 2
    seed: int = 0


QUICK = Settings(
    model="tiny", image_size=28, batch_size=64, chunks=12, chunk_steps=16,
    n_train=1000, n_test=500, threads=1,
)  # fmt: skip


def import_libauc() -> tuple[type, type]:
    """LibAUC's AUCMLoss and PESG, installed into benchmarks/.libauc on first use."""
    if not (LIBAUC_DIR / "libauc").is_dir():
        command = [sys.executable, "-m", "pip", "install", "--no-deps", "--target"]
        subprocess.run([*command, str(LIBAUC_DIR), f"libauc=={LIBAUC_VERSION}"], check=True)
    if "libauc" not in sys.modules:  # the package from LIBAUC_DIR, its submodules beside it
        package = LIBAUC_DIR / "libauc"
        spec = importlib.util.spec_from_file_location(
            "libauc", package / "__init__.py", submodule_search_locations=[str(package)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["libauc"] = module
        spec.loader.exec_module(module)
    from libauc.losses import AUCMLoss
    from libauc.optimizers import PESG

    return AUCMLoss, PESG


class Contender:
    """One way to train the shared initial model; ``train(n)`` runs n steps."""

    def __init__(self, name: str, model: nn.Module, batches: BatchStream) -> None:
        self.name = name
        self.model = model
        self.batches = batches

    def train(self, steps: int) -> None:
        raise NotImplementedError


class PlainSGD(Contender):
    """The machine's baseline: BCE-with-logits and ``torch.optim.SGD`` with weight decay."""

    def __init__(self, model: nn.Module, batches: BatchStream, s: Settings) -> None:
        super().__init__(BASELINE, model, batches)
        self.optimizer = torch.optim.SGD(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)

    def train(self, steps: int) -> None:
        self.model.train()
        for _ in range(steps):
            x, y, _ = next(self.batches)
            self.optimizer.zero_grad(set_to_none=True)
            nn.functional.binary_cross_entropy_with_logits(self.model(x), y).backward()
            self.optimizer.step()


class LibAUC(Contender):
    """LibAUC's AUCMLoss (v1, p fixed to the site's prevalence) and its PESG optimizer."""

    def __init__(
        self,
        name: str,
        model: nn.Module,
        batches: BatchStream,
        s: Settings,
        pos_ratio: float,
        momentum: float,
        epoch_decay: float,
    ) -> None:
        super().__init__(name, model, batches)
        loss_cls, pesg_cls = import_libauc()
        self.loss = loss_cls(margin=s.margin, imratio=pos_ratio, device=torch.device("cpu"))
        self.optimizer = pesg_cls(
            model.parameters(),
            loss_fn=self.loss,
            lr=s.lr,
            clip_value=s.grad_clip,
            weight_decay=s.weight_decay,
            epoch_decay=epoch_decay,
            momentum=momentum,
            verbose=False,
            device=torch.device("cpu"),
        )

    def train(self, steps: int) -> None:
        self.model.train()
        for _ in range(steps):
            x, y, _ = next(self.batches)
            self.optimizer.zero_grad(set_to_none=True)
            # auto=False: keep p at the site's prevalence (LibAUC re-estimates it per batch)
            self.loss(torch.sigmoid(self.model(x)), y, auto=False).backward()
            self.optimizer.step()


class FedAUC(Contender):
    """fed-auc's AUC-margin loss and a backend's min-max step, run as a one-site federation."""

    def __init__(
        self, algorithm: str, model: nn.Module, batches: BatchStream, s: Settings, pos_ratio: float
    ) -> None:
        super().__init__(f"fed-auc {algorithm}", model, batches)
        self.trainable = Trainable(model, AUCMarginLoss(1, pos_ratio=pos_ratio, margin=s.margin))
        extra = {"gamma": s.gamma} if algorithm in ("codasca", "coda_plus") else {}
        self.backend = build_backend(
            algorithm,
            lr=s.lr,
            weight_decay=s.weight_decay,
            grad_clip=s.grad_clip,
            local_steps=s.chunk_steps,
            decay_every=10**9,  # constant lr, as PESG without update_regularizer
            **extra,
        )
        self.state = self.backend.init_server(self.trainable, {"site": len(batches.split)})
        self.local_state: dict[str, Any] = {}
        self.round = 0

    def train(self, steps: int) -> None:
        if steps != self.backend.local_steps:
            raise ValueError(f"{self.name} trains {self.backend.local_steps} steps per round")
        broadcast = self.backend.plan(self.state, self.round)
        reply, self.local_state = self.backend.client_update(
            broadcast, self.local_state, self.trainable, self.batches
        )
        reply.site, reply.num_examples = "site", len(self.batches.split)
        reply = self.backend.complete_reply(reply, broadcast)
        self.state = self.backend.aggregate(self.state, [reply])  # one site: global = local
        self.round += 1


@dataclass
class Result:
    name: str
    images_per_s: list[float] = field(default_factory=list)  # one per chunk
    ratio_to_baseline: list[float] = field(default_factory=list)  # per chunk, time / baseline
    test_auc: float = float("nan")

    def row(self) -> dict[str, float | str]:
        return {
            "name": self.name,
            "img_s": statistics.median(self.images_per_s),
            "img_s_min": min(self.images_per_s),
            "img_s_max": max(self.images_per_s),
            "cost": statistics.median(self.ratio_to_baseline),
            "cost_min": min(self.ratio_to_baseline),
            "cost_max": max(self.ratio_to_baseline),
            "test_auc": self.test_auc,
        }


@torch.no_grad()
def test_auc(model: nn.Module, split: Split) -> float:
    model.eval()
    logits = torch.cat([model(x) for x in split.images.split(256)])
    return float(roc_auc_score(split.labels[:, 0].numpy(), logits[:, 0].numpy()))


def contenders(s: Settings, libauc: bool) -> tuple[list[Contender], Split]:
    """Every contender on one site, from one initial model and one batch seed."""
    profile = SiteProfile("bench", s.n_train, 2, s.n_test, s.imratio)
    site = make_site(profile, image_size=s.image_size, seed=s.seed)
    torch.manual_seed(s.seed)
    initial = build_model(s.model)
    p = site.train.positives()[0] / len(site.train)

    def fresh() -> tuple[nn.Module, BatchStream]:
        return copy.deepcopy(initial), BatchStream(site.train, s.batch_size, seed=s.seed)

    out: list[Contender] = [PlainSGD(*fresh(), s)]
    if libauc:
        out.append(LibAUC("LibAUC PESG (momentum 0, epoch_decay 0)", *fresh(), s, p, 0.0, 0.0))
        out.append(LibAUC("LibAUC PESG (defaults: momentum 0.9, epoch_decay 2e-3)",
                          *fresh(), s, p, 0.9, 2e-3))  # fmt: skip
    out.append(FedAUC("local_sgda", *fresh(), s, p))
    out.append(FedAUC("codasca", *fresh(), s, p))
    return out, site.test


def compare(s: Settings, libauc: bool = True, clock: Callable[[], float] = time.perf_counter):
    """Train every contender interleaved; per-chunk images/s, cost vs baseline, test AUC."""
    torch.set_num_threads(s.threads)
    racers, test_split = contenders(s, libauc)
    results = {c.name: Result(c.name) for c in racers}
    for chunk in range(s.chunks):
        shift = chunk % len(racers)
        seconds = {}
        for racer in racers[shift:] + racers[:shift]:
            start = clock()
            racer.train(s.chunk_steps)
            seconds[racer.name] = clock() - start
        for name, sec in seconds.items():
            results[name].images_per_s.append(s.chunk_steps * s.batch_size / sec)
            results[name].ratio_to_baseline.append(sec / seconds[BASELINE])
    for racer in racers:
        results[racer.name].test_auc = test_auc(racer.model, test_split)
    return [r.row() for r in results.values()]


def update_ms(s: Settings, repeats: int = 7) -> dict[str, list[float]]:
    """Milliseconds of each contender's parameter update alone, from the same given gradients
    (first repeat dropped): the step cost without the forward and backward passes."""
    torch.set_num_threads(s.threads)
    racers, _ = contenders(Settings(**{**vars(s), "n_train": 8, "n_test": 2}), libauc=True)
    torch.manual_seed(s.seed)
    grads = [torch.randn_like(p) for p in racers[0].model.parameters()]
    times: dict[str, list[float]] = {r.name: [] for r in racers}
    for _ in range(repeats):
        for racer in racers:
            times[racer.name].append(1000 * _time_update(racer, grads, s))
    return {name: t[1:] for name, t in times.items()}


def _time_update(racer: Contender, grads: list[torch.Tensor], s: Settings) -> float:
    if isinstance(racer, FedAUC):  # the backend's step, with these gradients
        trainable, dual = racer.trainable, [torch.zeros(1)]
        primal = [g.clone() for g in grads] + [torch.zeros(1), torch.zeros(1)]
        trainable.gradients = lambda *batch: (torch.zeros(()), primal, dual)
        rule = StepRule(s.lr, s.weight_decay, s.grad_clip)
        ref, correction = None, None
        if racer.backend.name == "codasca":  # proximal term and control-variate correction
            rule = StepRule(s.lr, s.weight_decay, s.grad_clip, s.gamma)
            ref = [t.detach().clone() for t in trainable.primal.values()]
            correction = ([torch.zeros_like(t) for t in ref], [torch.zeros(1)])
        start = time.perf_counter()
        sgda_step(trainable, (None, None), rule, ref, correction)
        return time.perf_counter() - start
    for p, g in zip(racer.model.parameters(), grads, strict=True):
        p.grad = g.clone()
    if isinstance(racer, LibAUC):
        for variable in (racer.loss.a, racer.loss.b, racer.loss.alpha):
            variable.grad = torch.zeros(1)
    start = time.perf_counter()
    racer.optimizer.step()
    return time.perf_counter() - start


def machine_line(s: Settings) -> str:
    """The shared machine line plus what matters for threading here."""
    return (
        f"{describe()}; {torch.get_num_interop_threads()} interop threads, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, seed {s.seed}"
    )


def markdown(
    rows: list[dict],
    s: Settings,
    command: str,
    load: tuple[float, float],
    updates: dict[str, list[float]] | None = None,
) -> str:
    lines = [
        "## Against the reference library: fed-auc vs LibAUC (one site)",
        "",
        f"`{command}`",
        "",
        f"Machine: {machine_line(s)}. Load average (1 min) {load[0]:.2f} before, "
        f"{load[1]:.2f} after.",
        "",
        f"{s.model} @ {s.image_size} px, batch {s.batch_size}, one synthetic site "
        f"({s.n_train} train / {s.n_test} test images, prevalence {s.imratio}), "
        f"{s.chunks} interleaved chunks × {s.chunk_steps} steps each, lr {s.lr}, "
        f"weight decay {s.weight_decay}, margin {s.margin}, gradient clip {s.grad_clip} "
        f"(AUC contenders), fed-auc codasca γ = {s.gamma:g}, LibAUC {LIBAUC_VERSION}.",
        "",
        "| contender | train img/s, median (range) | time / SGD + BCE, median (range) | test AUC |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['img_s']:.1f} ({r['img_s_min']:.1f}–{r['img_s_max']:.1f}) "
            f"| {r['cost']:.3f} ({r['cost_min']:.3f}–{r['cost_max']:.3f}) "
            f"| {r['test_auc']:.3f} |"
        )
    if updates:
        lines += [
            "",
            "The parameter update alone (gradients given, the same random ones for all; median "
            "and range of 6 repeats), which is all the optimizers differ in:",
            "",
            "| contender | update (ms) |",
            "|---|---|",
        ]
        for name, ms in updates.items():
            lines.append(f"| {name} | {statistics.median(ms):.1f} ({min(ms):.1f}–{max(ms):.1f}) |")
    lines += ["", NOTES, ""]
    return "\n".join(lines)


NOTES = """\
Like for like: every AUC contender uses p = the site's training prevalence (LibAUC's
`auto=False`; by default it re-estimates p per batch), the same lr, weight decay, margin and
clip value. Differences that remain, by design of each library: PESG clips the gradients of
a and b too (fed-auc clips network weights only); PESG steps α with its closed form
2(m + b − a) − 2α instead of the autograd gradient (which carries the factor p(1 − p));
PESG's defaults add momentum 0.9 and an epoch-level proximal term whose reference starts as
random N(0, 0.01) noise, where fed-auc codasca's proximal reference is the stage's start."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, few steps (seconds)")
    parser.add_argument("--threads", type=int, help="torch threads (default 2, quick 1)")
    parser.add_argument("--chunks", type=int)
    parser.add_argument("--markdown", type=Path, help="write the result table here")
    args = parser.parse_args()
    s = QUICK if args.quick else Settings()
    overrides = {k: v for k, v in (("threads", args.threads), ("chunks", args.chunks)) if v}
    s = Settings(**{**vars(s), **overrides})
    before = os.getloadavg()[0]
    rows = compare(s)
    updates = update_ms(s)
    command = command_line()
    text = markdown(rows, s, command, (before, os.getloadavg()[0]), updates)
    emit(text, args.markdown)


if __name__ == "__main__":
    main()
