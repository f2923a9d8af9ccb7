"""MONAI bundle export (``bundle/``): MONAI's own DenseNet, its weights as a plain state dict,
and an inference config that MONAI's bundle API runs (``python -m monai.bundle run
--config_file configs/inference.json``) — no fed-auc needed.

fed-auc wraps MONAI's network (``DenseNetClassifier.prepare``: upsampling to 32 px, input
normalization; ``fed_auc.tta``: sigmoid, mirror averaging); the config says the same with
MONAI components (``Resize`` bilinear, ``NormalizeIntensity``, ``Activations``) and two
expressions, so the bundle scores as ``fed-auc evaluate`` does. Input: a ``.npy`` array
(N, C, S, S) of [0, 1] images at the card's size; output: a CSV of scores per label.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fed_auc.io import save_json, save_text, save_torch
from fed_auc.models import ARCHITECTURES, INPUTS, MIN_SIDE, group_count
from fed_auc.registry.deploy import DEPLOY_FILE, Source

BUNDLE_DIR = "bundle"
SCHEMA = (
    "https://github.com/Project-MONAI/MONAI-extra-test-data/releases/download/0.8.1/"
    "meta_schema_20220324.json"
)


def network_def(source: Source) -> dict[str, Any]:
    """MONAI's DenseNet with exactly the arguments ``fed_auc.models`` builds it with."""
    model = source.model
    init_features, growth_rate, blocks = ARCHITECTURES[model.arch]
    norm: Any = (
        "batch" if model.norm == "batch" else ["group", {"num_groups": group_count(model.arch)}]
    )
    return {
        "_target_": "monai.networks.nets.DenseNet",
        "spatial_dims": 2,
        "in_channels": model.in_channels,
        "out_channels": model.num_labels,
        "init_features": init_features,
        "growth_rate": growth_rate,
        "block_config": list(blocks),
        "norm": norm,
    }


def preprocessing(source: Source) -> dict[str, Any]:
    """Per image (C, S, S): what ``DenseNetClassifier.prepare`` does to a batch."""
    transforms: list[dict[str, Any]] = []
    if source.image_size < MIN_SIDE:
        transforms.append({"_target_": "Resize", "spatial_size": [MIN_SIDE, MIN_SIDE],
                           "mode": "bilinear", "align_corners": False})  # fmt: skip
    if source.model.input_norm != "unit":
        mean, std = INPUTS[source.model.input_norm]
        transforms.append({"_target_": "NormalizeIntensity", "subtrahend": mean, "divisor": std})
    transforms.append({"_target_": "EnsureType", "data_type": "tensor", "track_meta": False})
    return {"_target_": "Compose", "transforms": transforms}


def inference_config(source: Source) -> dict[str, Any]:
    """configs/inference.json: ``run`` reads ``input_file`` and writes ``output_file``."""
    prepared = "$torch.stack(list(map(@preprocessing, {}))).to(@device)"
    views = ["$@postprocessing(@network(@batch))"]
    if source.tta == "flip":  # test-time augmentation: the mean with the mirror's score
        views.append("$@postprocessing(@network(@mirror))")
    return {
        "imports": ["$import numpy as np", "$import torch"],
        "bundle_root": ".",
        "device": "$torch.device('cpu')",
        "input_file": "$@bundle_root + '/images.npy'",
        "output_file": "$@bundle_root + '/scores.csv'",
        "image_size": source.image_size,
        "label_names": list(source.card["label_names"]),
        "test_time_augmentation": source.tta,
        "network_def": network_def(source),
        "network": "$@network_def.to(@device).eval()",
        "checkpoint": "$@bundle_root + '/models/model.pt'",
        "load_weights": "$@network.load_state_dict(torch.load(@checkpoint, "
        "map_location=@device, weights_only=True))",
        "preprocessing": preprocessing(source),
        "postprocessing": {"_target_": "Activations", "sigmoid": True},
        "images": "$torch.as_tensor(np.load(@input_file), dtype=torch.float32)",
        "batch": prepared.format("@images"),
        "mirror": prepared.format("@images.flip(-1)"),
        "views": views,
        "scores": "$torch.stack(@views).mean(0).float().cpu().numpy()",
        "write_scores": "$np.savetxt(@output_file, @scores, delimiter=',', "
        "header=','.join(@label_names), comments='')",
        "initialize": ["$torch.set_grad_enabled(False)", "$@load_weights"],
        "run": ["$@write_scores"],
    }


def metadata(source: Source, facts: dict[str, Any]) -> dict[str, Any]:
    """configs/metadata.json: MONAI's metadata fields, and fed-auc's facts under ``fed_auc``."""
    import monai

    s, names = source.image_size, facts["labels"]
    run_id = facts["training"]["run_id"]
    return {
        "schema": SCHEMA,
        "version": "0.1.0",
        "changelog": {"0.1.0": f"exported by fed-auc from run {run_id}"},
        "monai_version": monai.__version__,
        "pytorch_version": torch.__version__.split("+")[0],
        "numpy_version": np.__version__,
        "required_packages_version": {},
        "name": f"fed-auc {run_id}",
        "task": "per-label binary classification of 2-D grayscale images",
        "description": f"DenseNet ({source.model.arch}) trained by federated AUC maximization "
        f"(fed-auc run {run_id}); scores per label {names}; see docs/README.md",
        "authors": "fed-auc federation",
        "copyright": "the federation's sites",
        "intended_use": facts["intended_use"],
        "network_data_format": {
            "inputs": {
                "image": {
                    "type": "image",
                    "format": "magnitude",
                    "modality": "grayscale",
                    "num_channels": source.model.in_channels,
                    "spatial_shape": [s, s],
                    "dtype": "float32",
                    "value_range": [0, 1],
                    "is_patch_data": False,
                    "channel_def": {"0": "image"},
                }
            },
            "outputs": {
                "pred": {
                    "type": "probabilities",
                    "format": "classes",
                    "num_channels": len(names),
                    "spatial_shape": [len(names)],
                    "dtype": "float32",
                    "value_range": [0, 1],
                    "is_onehot": False,
                    "channel_def": dict(enumerate(names)),
                }
            },
        },  # fmt: skip
        "fed_auc": facts,
    }


def readme(facts: dict[str, Any]) -> str:
    """docs/README.md: what goes in, what comes out, the threshold and the calibration."""
    s = facts["input"]["image_size"]
    point, tta = facts["operating_point"], facts["test_time_augmentation"]
    calibration = facts["calibration"]
    how = (
        "Apply it per label: `probability = numpy.interp(score, entry['x'], entry['y'])` "
        "(the knots of an isotonic step function; constant beyond the ends)."
        if isinstance(calibration, list)
        else f"Calibration: {calibration}."
    )
    return "\n".join([
        f"# fed-auc model {facts['training']['run_id']} — MONAI bundle", "",
        "## Run", "",
        "```",
        "python -m monai.bundle run --config_file configs/inference.json \\",
        "    --meta_file configs/metadata.json --bundle_root . \\",
        "    --input_file images.npy --output_file scores.csv",
        "```", "",
        "(MONAI's command line needs the `fire` package), or from Python:", "",
        "```python",
        "from monai.bundle import run",
        "run(config_file='configs/inference.json', meta_file='configs/metadata.json',",
        "    bundle_root='.', input_file='images.npy', output_file='scores.csv')",
        "```", "",
        f"`images.npy`: float32 array (N, {facts['input']['shape'][1]}, {s}, {s}), grayscale "
        f"images resized to {s} px with intensities in [0, 1] (as fed-auc's data pipeline makes "
        "them). The config upsamples, normalizes "
        f"({facts['input']['normalization']['name']}) and applies test-time augmentation "
        f"`{tta['mode']}` ({tta['views']}) itself.", "",
        f"`scores.csv`: one row per image, one column per label {facts['labels']}: the sigmoid "
        "score `fed-auc evaluate` computes. Positive class per label: "
        f"{facts['positive_class']}.", "",
        "## Operating point", "",
        f"Threshold per label: {point['threshold']} — {point['rule']}. A score ≥ the "
        "threshold is positive (the threshold is on the score, not on the calibrated "
        "probability).", "",
        "## Calibration", "",
        f"{how} The maps are in `configs/metadata.json` under `fed_auc.calibration`.", "",
        "## Provenance", "",
        f"Everything fed-auc knows about this model: `configs/metadata.json` → `fed_auc` "
        f"(also `configs/{DEPLOY_FILE}`), the full model card in `docs/model_card.json`.", "",
    ])  # fmt: skip


def write_bundle(
    source: Source, out_dir: Path, facts: dict[str, Any], torchscript: Path | None = None
) -> Path:
    """Write ``bundle/`` (configs, models/model.pt as a state dict, models/model.ts when the
    TorchScript export was made, docs); returns its folder."""
    root = out_dir / BUNDLE_DIR
    facts = {**facts, "file": f"{BUNDLE_DIR}/models/model.pt",
             "runtime": "MONAI bundle (monai.bundle run)"}  # fmt: skip
    (root / "models").mkdir(parents=True)
    save_torch(source.model.net.state_dict(), root / "models" / "model.pt")
    if torchscript is not None:
        shutil.copy2(torchscript, root / "models" / "model.ts")
    save_json(inference_config(source), root / "configs" / "inference.json")
    save_json(metadata(source, facts), root / "configs" / "metadata.json")
    save_json(facts, root / "configs" / DEPLOY_FILE)
    save_text(readme(facts), root / "docs" / "README.md")
    save_text(json.dumps(source.card, indent=1), root / "docs" / "model_card.json")
    return root
