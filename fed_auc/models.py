"""DenseNet classifiers (MONAI) and their ordered layer groups for partial training.

The network outputs one raw logit per label; the loss applies the sigmoid. Layer groups
run from input to output (stem, dense blocks and transitions, final norm, classifier) so
that weak sites can train an output-side suffix of them (EmbracingFL).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from monai.networks.nets import DenseNet
from torch import nn

# arch -> (init_features, growth_rate, block_config)
ARCHITECTURES: dict[str, tuple[int, int, tuple[int, ...]]] = {
    "densenet121": (64, 32, (6, 12, 24, 16)),
    "densenet169": (64, 32, (6, 12, 32, 32)),
    "densenet201": (64, 32, (6, 12, 48, 32)),
    "tiny": (16, 8, (2, 2, 2)),
    # Between tiny and DenseNet121: ~3x tiny's CPU time per step at 32 px, 9x its weights.
    "small": (32, 16, (4, 4, 4)),
}

MIN_SIDE = 32  # MONAI DenseNet121's downsampling needs at least 32 px per side
_STEM_MODULES = ("conv0", "norm0", "relu0", "pool0")
_CONFIG_KEYS = ("arch", "num_labels", "in_channels", "norm", "input")
NORMS = ("batch", "group")  # group: per-example normalization, for DP-SGD (fed_auc.privacy.dp_sgd)
MAX_GROUPS = 32  # GroupNorm's usual group count (Wu & He, 2018), when the channels allow it
# The input normalization that goes with a set of weights, applied to fed-auc's [0, 1] images
# inside the model (so every node and every scoring of an exported model uses it): name ->
# (mean, std), x -> (x - mean) / std. "unit": fed-auc's own [0, 1]; "imagenet": torchvision's
# ImageNet statistics averaged over RGB, for the one replicated gray channel whose first
# convolution sums the three colour kernels; "xrv": torchxrayvision's [-1024, 1024] range.
INPUTS: dict[str, tuple[float, float]] = {
    "unit": (0.0, 1.0),
    "imagenet": (0.449, 0.226),
    "xrv": (0.5, 1.0 / 2048.0),
}


def _check_arch(arch: str) -> tuple[int, int, tuple[int, ...]]:
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown arch {arch!r}; valid: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[arch]


def group_count(arch: str) -> int:
    """GroupNorm's group count for ``arch``: the largest ≤ ``MAX_GROUPS`` that divides the
    channels of every norm layer (MONAI builds each with the same ``num_groups``)."""
    init_features, growth_rate, block_config = _check_arch(arch)
    bottleneck = 4 * growth_rate  # MONAI's bn_size
    channels, width = [bottleneck], init_features
    for i, layers in enumerate(block_config):
        channels += [width + j * growth_rate for j in range(layers)]
        width += layers * growth_rate
        channels.append(width)  # the transition's (or the final) norm
        if i < len(block_config) - 1:
            width //= 2
    common = math.gcd(*channels)
    return max(g for g in range(1, MAX_GROUPS + 1) if common % g == 0)


class DenseNetClassifier(nn.Module):
    """A 2-D MONAI DenseNet producing one logit per label, with small inputs upsampled.

    ``norm="group"`` swaps BatchNorm for GroupNorm (MONAI's ``norm`` option): it normalizes
    each example on its own, so a per-example gradient depends on that example only, which
    DP-SGD needs; BatchNorm mixes the batch."""

    def __init__(
        self,
        arch: str,
        num_labels: int = 1,
        in_channels: int = 1,
        norm: str = "batch",
        input_norm: str = "unit",
    ) -> None:
        super().__init__()
        init_features, growth_rate, block_config = _check_arch(arch)
        if num_labels < 1 or in_channels < 1:
            raise ValueError(
                f"num_labels and in_channels must be >= 1, got {num_labels} and {in_channels}"
            )
        if norm not in NORMS:
            raise ValueError(f"model norm must be one of {list(NORMS)}, got {norm!r}")
        if input_norm not in INPUTS:
            raise ValueError(f"model input must be one of {list(INPUTS)}, got {input_norm!r}")
        self.input_norm = input_norm
        self.arch = arch
        self.num_labels = num_labels
        self.in_channels = in_channels
        self.norm = norm
        layer = ("group", {"num_groups": group_count(arch)}) if norm == "group" else "batch"
        self.net = DenseNet(
            spatial_dims=2,
            in_channels=in_channels,
            out_channels=num_labels,
            init_features=init_features,
            growth_rate=growth_rate,
            block_config=block_config,
            norm=layer,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) images -> (B, num_labels) logits."""
        return self.net(self.prepare(x))

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """Check the image batch, upsample it to the network's minimum side and normalize it
        as the weights expect (``INPUTS``)."""
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"expected images of shape (B, {self.in_channels}, H, W), got {tuple(x.shape)}"
            )
        height, width = x.shape[-2:]
        if height < MIN_SIDE or width < MIN_SIDE:
            size = (max(height, MIN_SIDE), max(width, MIN_SIDE))
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
        if self.input_norm != "unit":
            mean, std = INPUTS[self.input_norm]
            x = (x - mean) / std
        return x

    def config(self) -> dict[str, Any]:
        """JSON-able description from which `model_from_config` rebuilds the architecture."""
        config = {"arch": self.arch, "num_labels": self.num_labels, "in_channels": self.in_channels}
        if self.norm != "batch":  # configs of BatchNorm models stay as they were recorded
            config["norm"] = self.norm
        if self.input_norm != "unit":  # likewise for models trained on fed-auc's [0, 1]
            config["input"] = self.input_norm
        return config


def build_model(
    arch: str,
    num_labels: int = 1,
    in_channels: int = 1,
    norm: str = "batch",
    input_norm: str = "unit",
) -> DenseNetClassifier:
    """A freshly initialised classifier of a named architecture."""
    return DenseNetClassifier(arch, num_labels, in_channels, norm, input_norm)


def model_from_config(cfg: dict[str, Any]) -> DenseNetClassifier:
    """Inverse of `DenseNetClassifier.config()`; rejects missing or unknown keys."""
    missing = [k for k in ("arch", "num_labels") if k not in cfg]
    unknown = [k for k in cfg if k not in _CONFIG_KEYS]
    if missing or unknown:
        raise ValueError(f"bad model config {cfg!r}: missing {missing}, unknown {unknown}")
    return DenseNetClassifier(
        cfg["arch"],
        int(cfg["num_labels"]),
        int(cfg.get("in_channels", 1)),
        str(cfg.get("norm", "batch")),
        str(cfg.get("input", "unit")),
    )


@dataclass(frozen=True)
class LayerGroup:
    """A named slice of the model: its parameter and buffer names (state_dict keys)."""

    name: str
    param_names: tuple[str, ...]
    buffer_names: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return self.param_names + self.buffer_names


def _module_group(section: str, module: str) -> str | None:
    """Group of a direct child `module` of `net.<section>`; None if it has no group."""
    if section == "features":
        if module in _STEM_MODULES:
            return "stem"
        if module == "norm5":
            return "norm"
        if module.startswith(("denseblock", "transition")):
            return module
    if section == "class_layers" and module == "out":
        return "classifier"
    return None


def group_of(name: str) -> str:
    """Group of a parameter/buffer name of a `DenseNetClassifier`, e.g. 'denseblock2'."""
    parts = name.split(".")
    group = _module_group(parts[1], parts[2]) if len(parts) >= 3 and parts[0] == "net" else None
    if group is None:
        raise ValueError(f"{name!r} is not a parameter or buffer name of a DenseNetClassifier")
    return group


def group_names(model: DenseNetClassifier) -> list[str]:
    """Group names of `model` in input-to-output order."""
    names: list[str] = []
    for module, _ in model.net.features.named_children():
        group = _module_group("features", module)
        if group is not None and group not in names:
            names.append(group)
    return [*names, "classifier"]


def layer_groups(model: DenseNetClassifier) -> list[LayerGroup]:
    """The ordered groups stem -> classifier; together they partition params and buffers."""
    order = group_names(model)
    params: dict[str, list[str]] = {g: [] for g in order}
    buffers: dict[str, list[str]] = {g: [] for g in order}
    for name, _ in model.named_parameters():
        params[group_of(name)].append(name)
    for name, _ in model.named_buffers():
        buffers[group_of(name)].append(name)
    return [LayerGroup(g, tuple(params[g]), tuple(buffers[g])) for g in order]
