"""Starting weights for a run (``--init``): a registered fed-auc model, a state_dict of the
experiment's MONAI DenseNet, or an ImageNet (torchvision) or torchxrayvision DenseNet
state_dict, mapped onto fed-auc's network with nothing loaded silently or left out silently.

Every tensor of the file is loaded, converted (the first convolution's colour channels
summed into the one gray channel) or replaced (a classifier for other labels, with its
operating thresholds; BatchNorm's running statistics in a GroupNorm network, which DP
needs: its scale and shift are loaded), and anything else is an error naming the file and
the tensor; every tensor of the model is loaded or listed as initialized. The report goes on
the model card.
The name mapping is MONAI's own (``monai.networks.nets.densenet._load_state_dict``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fed_auc.exchange import MODEL_FORMAT
from fed_auc.models import ARCHITECTURES, DenseNetClassifier
from fed_auc.registry.weights import WeightFile, read_weight_file

REGISTERED, MONAI, TORCHVISION, XRV = "fed-auc", "monai", "torchvision", "torchxrayvision"
INPUT_OF = {MONAI: "unit", TORCHVISION: "imagenet", XRV: "xrv"}  # models.INPUTS
FIRST_CONV = "net.features.conv0.weight"
CLASSIFIER = ("net.class_layers.out.weight", "net.class_layers.out.bias")
# torchvision's dense layers: features.denseblockB.denselayerL.norm1.weight, or norm.1 in
# old files; MONAI puts the same modules under .layers.
_LAYER = re.compile(r"^features\.(denseblock\d+\.denselayer\d+)\.(norm|relu|conv)\.?([12])\.(.+)$")
_BATCH_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")
_BLOCK = re.compile(r"denseblock(\d+)\.denselayer(\d+)\.")


@dataclass(frozen=True)
class InitWeights:
    """A starting-weights file read and recognised: its format, architecture, input
    normalization, tensors by the file's names, and for a registered model its card and AUC
    variables (a, b, α)."""

    file: WeightFile
    source: str
    arch: str
    input_norm: str
    card: dict[str, Any] = field(default_factory=dict)
    auc: dict[str, torch.Tensor] = field(default_factory=dict)
    model_config: dict[str, Any] = field(default_factory=dict)


def read_init(path: str | Path) -> InitWeights:
    """Read ``path`` (a file, or a registered model's folder) and recognise its format and
    architecture; refused with the file and the reason when it is none of the four."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.pt"
    file = read_weight_file(path)
    content = file.content
    if isinstance(content, dict) and content.get("format") == MODEL_FORMAT:
        card_file = path.parent / "model_card.json"
        card = json.loads(card_file.read_text()) if card_file.is_file() else {}
        config = dict(content["model_config"])
        for key in ("label_names", "positive_class", "image_size"):
            card.setdefault(key, content.get(key))
        return InitWeights(
            file, REGISTERED, str(config["arch"]), str(config.get("input", "unit")),
            card, dict(content.get("auc", {})), config,
        )  # fmt: skip
    source = _source(file)
    return InitWeights(file, source, _architecture(file, source), INPUT_OF[source])


def _source(file: WeightFile) -> str:
    names = list(file.tensors)
    if any(n.startswith(("net.features.", "features.", "class_layers.")) and ".layers." in n
           for n in names):  # fmt: skip
        return MONAI
    if "features.conv0.weight" in file.tensors:
        gray = file.tensors["features.conv0.weight"].shape[1] == 1
        return XRV if gray or "op_threshs" in file.tensors else TORCHVISION
    raise ValueError(
        f"weights {file.path}: not a DenseNet state_dict fed-auc knows (a fed-auc model, MONAI's "
        f"DenseNet, torchvision's or torchxrayvision's); first key: {names[0]!r}"
    )


def _architecture(file: WeightFile, source: str) -> str:
    """The ``ARCHITECTURES`` entry whose layers per block and widths the file has."""
    blocks: dict[int, int] = {}
    for name in file.tensors:
        found = _BLOCK.search(name)
        if found:
            block, layer = int(found.group(1)), int(found.group(2))
            blocks[block] = max(blocks.get(block, 0), layer)
    conv0 = file.tensors.get(("net." if source == MONAI else "") + "features.conv0.weight")
    if conv0 is None:
        conv0 = file.tensors.get("features.conv0.weight")
    if conv0 is None:
        raise ValueError(f"weights {file.path}: no first convolution (features.conv0.weight)")
    layout = tuple(blocks[b] for b in sorted(blocks))
    for arch, (init_features, _, block_config) in ARCHITECTURES.items():
        if tuple(block_config) == layout and conv0.shape[0] == init_features:
            return arch
    known = {a: (f, tuple(b)) for a, (f, _, b) in ARCHITECTURES.items()}
    raise ValueError(
        f"weights {file.path}: a DenseNet with {conv0.shape[0]} initial features (its "
        f"features.conv0.weight has shape {tuple(conv0.shape)}) and blocks {layout}, none of "
        f"fed-auc's (initial features, blocks): {known}"
    )


def monai_name(name: str, source: str) -> str | None:
    """The fed-auc (MONAI) name of a file's tensor; None for a classifier of other labels."""
    if source in (REGISTERED, MONAI):
        return name if name.startswith("net.") else f"net.{name}"
    if name == "op_threshs" or name.startswith("classifier."):
        return None
    layer = _LAYER.match(name)
    if layer:
        block, module, index, rest = layer.groups()
        return f"net.features.{block}.layers.{module}{index}.{rest}"
    return f"net.{name}"


def apply_init(init: InitWeights, model: DenseNetClassifier) -> dict[str, Any]:
    """Load ``init`` into ``model`` in place; returns the report for the model card (the
    file's SHA-256, format, input normalization, and which tensors were loaded, converted,
    replaced and initialized). Refuses, naming the file and the first offending tensor, a
    tensor with no place in the model, of another shape, or a model tensor with no value."""
    path, target = init.file.path, model.state_dict()
    values: dict[str, torch.Tensor] = {}
    loaded, converted, replaced = [], [], []
    for name, value in init.file.tensors.items():
        dest = monai_name(name, init.source)
        if dest is None:
            replaced.append(name)
            continue
        if dest not in target and model.norm == "group" and name.endswith(_BATCH_STATISTICS):
            replaced.append(name)  # GroupNorm (DP) keeps no running statistics
            continue
        if dest not in target:
            raise ValueError(
                f"weights {path}: tensor {name!r} has no place in a {model.arch} model "
                f"(norm {model.norm}, {model.num_labels} label(s)): another architecture?"
            )
        want = target[dest].shape
        colour = dest == FIRST_CONV and want[1] == 1 < value.shape[1]
        # the colour kernels, seen by one gray channel; any other shape is refused as it is
        found = value.sum(dim=1, keepdim=True) if colour else value
        if found.shape != want:
            raise ValueError(
                f"weights {path}: tensor {name!r} has shape {tuple(value.shape)}, the "
                f"{model.arch} model's {dest!r} {tuple(want)}: another architecture?"
            )
        (converted if colour else loaded).append(name)
        values[dest] = found.to(target[dest].dtype)
    initialized = [n for n in target if n not in values]
    missing = [n for n in initialized if n not in CLASSIFIER and "num_batches_tracked" not in n]
    if missing:
        raise ValueError(
            f"weights {path}: no tensor for the model's {missing[0]!r} ({len(missing)} missing: "
            "a truncated file, or another architecture)"
        )
    if replaced and any(n in values for n in CLASSIFIER):
        raise ValueError(f"weights {path}: two classifiers ({replaced[0]!r} and a MONAI one)")
    model.load_state_dict({**target, **values})
    return {
        "path": str(path),
        "sha256": init.file.sha256,
        "format": init.source,
        "arch": init.arch,
        "input": model.input_norm,
        "classifier": "re-initialized for the run's labels"
        if any(n in initialized for n in CLASSIFIER)
        else "kept (the file's labels are the run's)",
        "loaded": loaded,
        "converted": converted,
        "replaced": replaced,
        "initialized": initialized,
    }
