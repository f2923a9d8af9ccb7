"""Test-time augmentation (TTA): score an image and its mirror, average the probabilities.

A network trained with left-right flips (``--augment flip``) is nearly, not exactly,
mirror-invariant; averaging h(x) and h(flip x) cancels part of what is left. On the three
exported BreastMNIST models of the earlier recipe it raised test AUC by 0.008–0.020
(BENCHMARKS.md). Every place that scores a model uses the same mode: a node's validation
(which picks the exported round) and test splits, the operating threshold, and
``fed-auc evaluate`` (which reads the mode from the model card).

Modes (``--tta``): ``none`` (the image as is) and ``flip`` (mean of image and mirror).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fed_auc.data.memmap import Images, chunks
from fed_auc.trainable import full_precision

TTA_MODES = ("none", "flip")


def check_tta(mode: str) -> str:
    """``mode`` if it is a known TTA mode, else a ValueError naming the valid ones."""
    if mode not in TTA_MODES:
        raise ValueError(f"tta must be one of {list(TTA_MODES)}, got {mode!r}")
    return mode


def default_tta(augment: str) -> str:
    """flip when the training batches are flipped (a model trained on mirrors scores both
    alike), else none: the default of ``fed-auc simulate`` and of a node given no mode."""
    return "flip" if augment in ("flip", "crop_flip") else "none"


def views(images: torch.Tensor, mode: str) -> list[torch.Tensor]:
    """The versions of a (B, C, H, W) batch that are scored and averaged."""
    check_tta(mode)
    return [images] if mode == "none" else [images, images.flip(-1)]


@torch.no_grad()
def predict(
    model: nn.Module,
    images: Images,
    mode: str = "none",
    batch: int = 256,
    pin_memory: bool = False,
) -> np.ndarray:
    """sigmoid(logit) per image and label, averaged over the TTA views; the model in eval mode.
    Cached images stream from disk (``fed_auc.data.memmap.chunks``; ``pin_memory`` for a GPU);
    each chunk goes to the model's device and the scores come back fp32 on the CPU (the caller
    chooses the precision with ``torch.autocast``)."""
    model.eval()
    device = next(model.parameters()).device
    out = []
    for chunk in chunks(images, batch, pin_memory):
        chunk = chunk.to(device, non_blocking=True)
        probs = [torch.sigmoid(full_precision(model(view))) for view in views(chunk, mode)]
        out.append(torch.stack(probs).mean(0).cpu())
    if not out:
        check_tta(mode)
        return np.zeros((0, model.num_labels), dtype=np.float32)
    return torch.cat(out).numpy()
