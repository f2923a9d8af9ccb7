"""Small splits and images the sampling, augmentation and TTA tests share."""

from __future__ import annotations

import torch

from fed_auc.data.base import Split


def make_split(n: int, positives: int, num_labels: int = 1, size: int = 4) -> Split:
    """Images carry their row index, so a batch's rows can be read back from x."""
    images = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 1, size, size)
    labels = torch.zeros(n, num_labels)
    labels[torch.arange(positives) * (n // max(positives, 1)), -1] = 1.0
    return Split(images.contiguous(), labels)


def ramp_images(n: int = 64, size: int = 16) -> torch.Tensor:
    """Row i: pixels i + (0, 1), all different within an image, so flips and shifts show."""
    base = torch.arange(size * size, dtype=torch.float32).view(1, 1, size, size) + 1
    return base.repeat(n, 1, 1, 1) / (size * size + 1) + torch.arange(n).view(n, 1, 1, 1)
