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
# A scoring chunk holds at most this many pixels: 32 images at 224 px, where DenseNet121's
# activations take ~8 MB an image on a CPU (256 at a time peaked near 2.7 GB); small images
# still go 256 at a time (BENCHMARKS.md, "Hospital scale: streamed image cache").
SCORING_PIXELS = 32 * 224 * 224
MAX_SCORING_BATCH = 256


def check_tta(mode: str) -> str:
    """``mode`` if it is a known TTA mode, else a ValueError naming the valid ones."""
    if mode not in TTA_MODES:
        raise ValueError(f"tta must be one of {list(TTA_MODES)}, got {mode!r}")
    return mode


def default_tta(augment: str) -> str:
    """flip when the training batches are flipped (a model trained on mirrors scores both
    alike), else none: the default of ``fed-auc simulate`` and of a node given no mode."""
    return "flip" if augment in ("flip", "crop_flip") else "none"


def scoring_batch(images: Images) -> int:
    """How many images are scored at once: as many as ``SCORING_PIXELS`` allows, 1 to
    ``MAX_SCORING_BATCH``. Scores do not depend on it beyond float rounding: in eval mode no
    statistic crosses images."""
    pixels = int(images.shape[-1]) * int(images.shape[-2])
    return max(1, min(MAX_SCORING_BATCH, SCORING_PIXELS // max(pixels, 1)))


def views(images: torch.Tensor, mode: str) -> list[torch.Tensor]:
    """The versions of a (B, C, H, W) batch that are scored and averaged."""
    check_tta(mode)
    return [images] if mode == "none" else [images, images.flip(-1)]


@torch.no_grad()
def predict(
    model: nn.Module,
    images: Images,
    mode: str = "none",
    batch: int | None = None,
    pin_memory: bool = False,
) -> np.ndarray:
    """sigmoid(logit) per image and label, averaged over the TTA views; the model in eval mode.
    Cached images stream from disk (``fed_auc.data.memmap.chunks``; ``pin_memory`` for a GPU);
    each chunk goes to the model's device and the scores come back fp32 on the CPU (the caller
    chooses the precision with ``torch.autocast``). ``batch``: images per chunk (None: sized by
    ``scoring_batch``)."""
    model.eval()
    device = next(model.parameters()).device
    out = []
    for chunk in chunks(images, batch or scoring_batch(images), pin_memory):
        chunk = chunk.to(device, non_blocking=True)
        probs = [torch.sigmoid(full_precision(model(view))) for view in views(chunk, mode)]
        out.append(torch.stack(probs).mean(0).cpu())
    if not out:
        check_tta(mode)
        return np.zeros((0, model.num_labels), dtype=np.float32)
    return torch.cat(out).numpy()
