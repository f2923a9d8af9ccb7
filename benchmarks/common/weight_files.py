"""Weight files with torchvision's or torchxrayvision's key names and random values, for the
tests and the ``--init`` benchmark (neither package imports here: their names are written
out, as MONAI's converter reads them)."""

from __future__ import annotations

import re

import torch

from fed_auc.models import build_model

_MONAI_LAYER = re.compile(r"^net\.features\.(denseblock\d+\.denselayer\d+)\.layers\.(.+)$")


def torchvision_name(monai: str) -> str:
    """The torchvision name of a fed-auc (MONAI) tensor name."""
    layer = _MONAI_LAYER.match(monai)
    if layer:
        return f"features.{layer.group(1)}.{layer.group(2)}"
    if monai.startswith("net.class_layers.out."):
        return "classifier." + monai.rsplit(".", 1)[1]
    return monai.removeprefix("net.")


def densenet_file(
    arch: str, outputs: int, in_channels: int, seed: int = 1, xrv: bool = False
) -> dict[str, torch.Tensor]:
    """A state_dict with torchvision's key names (``xrv``: torchxrayvision's, with its
    operating thresholds) for ``arch``: random values, ``in_channels`` input channels,
    ``outputs`` classifier outputs."""
    generator = torch.Generator().manual_seed(seed)
    model = build_model(arch, num_labels=outputs, in_channels=in_channels)
    out = {}
    for name, tensor in model.state_dict().items():
        value = tensor.clone()
        if tensor.is_floating_point():  # a network's scale, but no value of a fresh one
            noise = torch.randn(tensor.shape, generator=generator)
            value = tensor * (1 + 0.1 * noise) + 0.01 * noise
            if name.endswith("running_var"):
                value = value.abs() + 0.5
        out[torchvision_name(name)] = value
    if xrv:
        out["op_threshs"] = torch.rand(outputs, generator=generator)
    return out
