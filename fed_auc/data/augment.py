"""Training-time augmentation of image batches: seeded, shape- and label-preserving.

A few hundred real images (BreastMNIST: 546) are memorised within a few epochs; the
references (MedMNIST v2, LibAUC) train with random crops and flips. Augmentation acts on the
batch tensor inside the node's batch stream (``BatchStream``), so only training batches are
changed: evaluation reads the splits directly and never sees it.

Modes (``--augment``):
- ``none``: batches as stored.
- ``flip``: each image mirrored left-right with probability 1/2.
- ``crop_flip``: each image shifted by a random offset of up to ``size // 8`` pixels per
  axis (zero-padded, then cropped back to its size: a "random crop with padding"), then
  flipped as above.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

AUGMENTATIONS = ("none", "flip", "crop_flip")


class Augment:
    """A seeded batch transform ``(B, C, H, W) -> (B, C, H, W)``; labels are not touched.

    Its generator state is part of ``state_dict`` so a resumed node draws the same crops.
    """

    def __init__(self, mode: str = "none", seed: int = 0) -> None:
        if mode not in AUGMENTATIONS:
            raise ValueError(f"augment must be one of {list(AUGMENTATIONS)}, got {mode!r}")
        self.mode = mode
        self._generator = torch.Generator().manual_seed(int(seed))

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if images.ndim != 4:
            raise ValueError(f"augment expects (B, C, H, W) images, got {tuple(images.shape)}")
        if self.mode == "none" or len(images) == 0:
            return images
        if self.mode == "crop_flip":
            images = self._shift(images)
        return self._flip(images)

    def _flip(self, images: torch.Tensor) -> torch.Tensor:
        mirror = torch.rand(len(images), generator=self._generator) < 0.5
        return torch.where(mirror[:, None, None, None], images.flip(-1), images)

    def _shift(self, images: torch.Tensor) -> torch.Tensor:
        """Random crop of the zero-padded image back to its own size, per image."""
        height, width = images.shape[-2:]
        pad = max(1, min(height, width) // 8)
        padded = F.pad(images, (pad, pad, pad, pad))
        offsets = torch.randint(0, 2 * pad + 1, (len(images), 2), generator=self._generator)
        return torch.stack(
            [
                padded[i, :, top : top + height, left : left + width]
                for i, (top, left) in enumerate(offsets.tolist())
            ]
        )

    def state_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "generator": self._generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["mode"] != self.mode:
            raise ValueError(f"state is for augment {state['mode']!r}, this one is {self.mode!r}")
        self._generator.set_state(state["generator"])
