"""LibAUC centralized on a federation's pooled images: the reference beside ``auc_vs_ce.py``.

The same training images the federation's sites hold (the partition of ``fed-auc simulate``
with the same seed, so the same imratio cuts), pooled in one place; the same validation and
test images; the same network (fed-auc's DenseNet of the recipe at 28 px, one channel). Training
is LibAUC's own two-phase recipe with LibAUC's parts (``libauc_breastmnist.libauc_parts``):
BCE with its Adam at half positives per batch, then the classifier re-initialized and
AUCMLoss + PESG at 20 % positives, lr ÷ 10 at 50 % and 75 % of the phase; the model is the
phase-2 epoch with the best validation AUC (LibAUC's selection rule).
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.anchors.libauc_breastmnist import Recipe, Splits, libauc_parts, run_phase
from fed_auc.data.medmnist import load_medmnist
from fed_auc.data.partition import partition_pool
from fed_auc.models import build_model, group_of

# LibAUC's BreastMNIST recipe (libauc_breastmnist.Recipe) at batch 32 as fed-auc's sites use,
# with as many training images as the federation's recipe (auc_vs_ce.FILE_RECIPE: 5 + 15
# rounds × 4 sites × 8 steps × 32): a DualSampler epoch of the pooled 5 % federation holds
# ~800 images at half positives and ~500 at 20 %, so 6 BCE and 30 AUC epochs.
CENTRAL = replace(Recipe(), image_size=28, batch_size=32, ce_epochs=6, auc_epochs=30)


def pooled_splits(npz: Path, partition: str, seed: int, sites: int = 4) -> Splits:
    """The federation's training images pooled, and its validation and test images."""
    pool = load_medmnist(npz, 28, positive_label=0)
    federation, _ = partition_pool(pool, partition, sites, seed)

    def cat(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [getattr(site, split) for site in federation]
        return torch.cat([p.images for p in parts]), torch.cat([p.labels for p in parts])

    return Splits(cat("train"), cat("val"), cat("test"))


def run_central(
    npz: Path, partition: str, seed: int, recipe: Recipe = CENTRAL, arch: str = "tiny"
) -> dict[str, Any]:
    """Both LibAUC phases on the pooled data; validation and test AUC of the selected epoch."""
    torch.set_num_threads(1)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    start = time.perf_counter()
    parts = libauc_parts()
    data = pooled_splits(npz, partition, seed)
    cpu = torch.device("cpu")
    model = build_model(arch)
    adam = parts.Adam(
        model.parameters(), lr=recipe.ce_lr, weight_decay=recipe.ce_weight_decay, verbose=False
    )
    run_phase(
        parts.DualSampler, model, torch.nn.BCELoss(), adam,
        lambda opt: opt.update_lr(decay_factor=10),
        recipe.ce_epochs, recipe.ce_sampling_rate, data, recipe, seed, "BCE",
    )  # fmt: skip
    fresh = build_model(arch).state_dict()
    state = model.state_dict()
    model.load_state_dict(
        {k: fresh[k] if group_of(k) == "classifier" else v for k, v in state.items()}
    )
    aucm = parts.AUCMLoss(margin=recipe.margin, device=cpu)
    pesg = parts.PESG(
        model.parameters(), loss_fn=aucm, lr=recipe.auc_lr, momentum=recipe.auc_momentum,
        epoch_decay=recipe.auc_epoch_decay, weight_decay=recipe.auc_weight_decay,
        verbose=False, device=cpu,
    )  # fmt: skip
    log = run_phase(
        parts.DualSampler, model, aucm, pesg,
        lambda opt: opt.update_regularizer(decay_factor=10),
        recipe.auc_epochs, recipe.auc_sampling_rate, data, recipe, seed, "AUCM",
    )  # fmt: skip
    best = max(log, key=lambda e: e["val_auc"])
    return {
        "val_auc": best["val_auc"],
        "test_auc": best["test_auc"],
        "last_test_auc": log[-1]["test_auc"],
        "best_epoch": best["epoch"],
        "seconds": time.perf_counter() - start,
        "load": os.getloadavg()[0],
    }
