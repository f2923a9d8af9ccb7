"""LibAUC's own BreastMNIST recipe, run centralized on this machine: the reference beside fed-auc.

The issue's reference (DenseNet121 @ 32 px, cross-entropy then AUC-margin + PESG, test AUC of
the best-validation epoch) quoted 0.909 ± 0.012 without the script. This runs it with
LibAUC's own parts: its ``densenet121`` (ReLU, no pretrained weights), ``DualSampler``,
``Adam``, ``AUCMLoss`` and ``PESG``, with the hyperparameters of LibAUC's trainer recipes for
BreastMNIST (``examples/trainer_recipes/image_trainer/config_{ce,auc}_BreastMNIST.yaml``):

- phase 1: BCE on sigmoid scores, Adam lr 1e-3, weight decay 1e-4, batch 128 with half
  positives (``sampling_rate`` 0.5), 60 epochs, lr ÷ 10 at epochs 30 and 45;
- phase 2: the phase-1 weights without the classifier (LibAUC's loader skips the head),
  AUCMLoss (margin 1, p estimated per batch) + PESG lr 0.1, momentum 0.9, epoch_decay 3e-3,
  weight decay 1e-5, ``sampling_rate`` 0.2, 60 epochs, ``update_regularizer(10)`` at 30, 45.

Its images are the file's 28 px images scaled to [0, 1], resized to 32 px and repeated to
three channels, without augmentation (LibAUC's BreastMNIST loader is ``ToTensor`` only). The
split is the file's own train/val/test, as in fed-auc's ``--sites 1`` run.

LibAUC is never a dependency of fed-auc: it is installed (``--no-deps``) into
``benchmarks/.libauc`` on first use. Its ``libauc.models`` package imports torch_geometric and
its sampler module imports torchvision (unused by ``DualSampler`` when labels are given), so
the DenseNet file is loaded on its own and torchvision is stubbed for that import only.

    python -m benchmarks.anchors.libauc_breastmnist --npz ../shared/data/breastmnist.npz \
        --seeds 0 1 2 --jobs 2 --markdown benchmarks/results/libauc_breastmnist.md
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
import time
import types
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.anchors.libauc_compare import LIBAUC_DIR, import_libauc
from benchmarks.common.fragment import emit, provenance
from fed_auc.data.images import resize
from fed_auc.data.medmnist import load_medmnist


@dataclass(frozen=True)
class Recipe:
    """LibAUC's BreastMNIST trainer recipes, with the issue's DenseNet121 @ 32 px."""

    image_size: int = 32
    batch_size: int = 128
    eval_batch_size: int = 256
    ce_epochs: int = 60
    ce_lr: float = 1e-3
    ce_weight_decay: float = 1e-4
    ce_sampling_rate: float = 0.5
    auc_epochs: int = 60
    auc_lr: float = 0.1
    auc_momentum: float = 0.9
    auc_epoch_decay: float = 3e-3
    auc_weight_decay: float = 1e-5
    auc_sampling_rate: float = 0.2
    margin: float = 1.0
    decay_at: tuple[float, ...] = (0.5, 0.75)  # fractions of a phase's epochs: lr ÷ 10
    threads: int = 1


QUICK = replace(Recipe(), ce_epochs=2, auc_epochs=2, batch_size=16, eval_batch_size=64)


@dataclass
class Splits:
    """Images (N, 3, S, S) in [0, 1] and labels (N, 1) per split."""

    train: tuple[torch.Tensor, torch.Tensor]
    val: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]


def load_splits(npz: Path, image_size: int) -> Splits:
    """The file's own splits, as LibAUC's loader feeds them to a three-channel DenseNet."""
    pool = load_medmnist(npz)
    if pool.labels.shape[1] != 1:
        raise ValueError(f"{npz}: {pool.labels.shape[1]} labels; this reference is binary")
    images = resize(pool.images, image_size).expand(-1, 3, -1, -1).contiguous()

    def split(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.from_numpy(np.flatnonzero(pool.split == name))
        return images[rows], pool.labels[rows].float()

    return Splits(split("train"), split("val"), split("test"))


def libauc_parts() -> types.SimpleNamespace:
    """LibAUC's classes, imported around its optional-dependency imports (see the docstring)."""
    import_libauc()  # installs into benchmarks/.libauc and imports the package from there
    spec = importlib.util.spec_from_file_location(
        "libauc_densenet", LIBAUC_DIR / "libauc" / "models" / "densenet.py"
    )
    densenet = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(densenet)
    from libauc.losses import AUCMLoss
    from libauc.optimizers import PESG, Adam

    stubbed = "torchvision" not in sys.modules
    if stubbed:  # only for this import: MONAI's optional imports must not find a fake one
        stub = types.ModuleType("torchvision")
        stub.datasets = types.SimpleNamespace(ImageFolder=type("ImageFolder", (), {}))
        sys.modules["torchvision"] = stub
    try:
        from libauc.sampler import DualSampler
    finally:
        if stubbed:
            del sys.modules["torchvision"]

    return types.SimpleNamespace(
        densenet121=densenet.densenet121,
        AUCMLoss=AUCMLoss,
        PESG=PESG,
        Adam=Adam,
        DualSampler=DualSampler,
    )


def scores(model: nn.Module, images: torch.Tensor, batch_size: int) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        out = [torch.sigmoid(model(x)) for x in images.split(batch_size)]
    return torch.cat(out).flatten().numpy()


def auc(model: nn.Module, split: tuple[torch.Tensor, torch.Tensor], batch_size: int) -> float:
    images, labels = split
    return float(roc_auc_score(labels.flatten().numpy(), scores(model, images, batch_size)))


def run_phase(
    sampler_class: type,
    model: nn.Module,
    loss_of_scores: Any,
    optimizer: Any,
    decay: Any,
    epochs: int,
    sampling_rate: float,
    data: Splits,
    recipe: Recipe,
    seed: int,
    phase: str,
) -> list[dict[str, float]]:
    """Epochs of LibAUC's image trainer loop; val and test AUC after each epoch."""
    x, y = data.train
    sampler = sampler_class(
        TensorDataset(x, y),
        recipe.batch_size,
        labels=y.flatten().numpy(),
        sampling_rate=sampling_rate,
        random_seed=seed,
    )
    loader = DataLoader(TensorDataset(x, y), batch_size=recipe.batch_size, sampler=sampler)
    decay_epochs = {int(f * epochs) for f in recipe.decay_at}
    log = []
    for epoch in range(epochs):
        if epoch in decay_epochs:
            decay(optimizer)
        model.train()
        start = time.perf_counter()
        for images, labels in loader:
            loss = loss_of_scores(torch.sigmoid(model(images)), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        log.append(
            {
                "epoch": epoch + 1,
                "seconds": time.perf_counter() - start,
                "val_auc": auc(model, data.val, recipe.eval_batch_size),
                "test_auc": auc(model, data.test, recipe.eval_batch_size),
            }
        )
        print(f"seed {seed} {phase} epoch {epoch + 1}/{epochs}: val AUC {log[-1]['val_auc']:.3f}",
              file=sys.stderr, flush=True)  # fmt: skip
    return log


def run_seed(npz: Path, recipe: Recipe, seed: int) -> dict[str, Any]:
    """Both phases for one seed; the test AUC of phase 2's best-validation epoch."""
    torch.set_num_threads(recipe.threads)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    parts = libauc_parts()
    data = load_splits(npz, recipe.image_size)
    cpu = torch.device("cpu")

    def densenet() -> nn.Module:
        return parts.densenet121(
            pretrained=False, last_activation=None, activations="relu", num_classes=1
        )

    model = densenet()
    bce = nn.BCELoss()
    adam = parts.Adam(
        model.parameters(), lr=recipe.ce_lr, weight_decay=recipe.ce_weight_decay, verbose=False
    )
    ce_log = run_phase(
        parts.DualSampler, model, bce, adam, lambda opt: opt.update_lr(decay_factor=10),
        recipe.ce_epochs, recipe.ce_sampling_rate, data, recipe, seed, "BCE",
    )  # fmt: skip

    head = {"classifier"}  # LibAUC's pretrained loader skips fc / linear / classifier / head
    pretrained = {k: v for k, v in model.state_dict().items() if not head & set(k.split("."))}
    model = densenet()
    missing, unexpected = model.load_state_dict(pretrained, strict=False)
    if unexpected or any(not head & set(k.split(".")) for k in missing):
        raise RuntimeError(f"phase-1 weights did not fit: missing {missing}, extra {unexpected}")
    aucm = parts.AUCMLoss(margin=recipe.margin, device=cpu)
    pesg = parts.PESG(
        model.parameters(),
        loss_fn=aucm,
        lr=recipe.auc_lr,
        momentum=recipe.auc_momentum,
        epoch_decay=recipe.auc_epoch_decay,
        weight_decay=recipe.auc_weight_decay,
        verbose=False,
        device=cpu,
    )
    auc_log = run_phase(
        parts.DualSampler, model, aucm, pesg, lambda opt: opt.update_regularizer(decay_factor=10),
        recipe.auc_epochs, recipe.auc_sampling_rate, data, recipe, seed, "AUCM",
    )  # fmt: skip
    best = max(auc_log, key=lambda e: e["val_auc"])  # first epoch among ties, as LibAUC's log
    return {
        "seed": seed,
        "ce_val_auc": ce_log[-1]["val_auc"],
        "ce_test_auc": ce_log[-1]["test_auc"],
        "best_epoch": best["epoch"],
        "val_auc": best["val_auc"],
        "test_auc": best["test_auc"],
        "last_test_auc": auc_log[-1]["test_auc"],
        "seconds": sum(e["seconds"] for e in ce_log + auc_log),
        "auc_log": auc_log,
    }


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def markdown(results: list[dict[str, Any]], recipe: Recipe, npz: Path, elapsed_s: float) -> str:
    settings = f"`{npz.name}`, the file's own splits; " + ", ".join(
        f"{k} {v}" for k, v in asdict(recipe).items()
    )
    seeds = " ".join(str(r["seed"]) for r in results)
    lines = [
        "### LibAUC's own BreastMNIST recipe, centralized, on this machine",
        "",
        provenance(seeds, elapsed_s, settings + "."),
        "",
        "| seed | phase 1 (BCE) val / test AUC | best-val epoch | val AUC | test AUC | "
        "last-epoch test AUC | minutes |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['seed']} | {r['ce_val_auc']:.3f} / {r['ce_test_auc']:.3f} | {r['best_epoch']} "
            f"| {r['val_auc']:.3f} | {r['test_auc']:.3f} | {r['last_test_auc']:.3f} "
            f"| {r['seconds'] / 60:.1f} |"
        )
    lines += [
        "",
        f"Test AUC at the best-validation epoch: **{mean_sd([r['test_auc'] for r in results])}** "
        f"over {len(results)} seed(s); validation {mean_sd([r['val_auc'] for r in results])}; "
        f"phase 1 alone (last BCE epoch): {mean_sd([r['ce_test_auc'] for r in results])}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--npz", type=Path, default=Path("../shared/data/breastmnist.npz"),
        help="a MedMNIST-layout binary .npz (../shared/data/breastmnist.npz)",
    )  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", help="0 1 2 (0 under --quick)")
    parser.add_argument("--jobs", type=int, default=1, help="seeds run in parallel (1)")
    parser.add_argument("--quick", action="store_true", help="2 + 2 epochs at batch 16, seed 0")
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    parser.add_argument("--json", type=Path, help="also write every epoch's AUCs here")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    recipe = QUICK if args.quick else Recipe()
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_seed, args.npz, recipe, seed) for seed in seeds]
        results = [f.result() for f in futures]
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    emit(markdown(results, recipe, args.npz, time.perf_counter() - start), args.markdown)


if __name__ == "__main__":
    main()
