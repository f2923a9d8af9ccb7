"""What every deployable export of a registered model shares: the scoring module it holds and
the card's facts it carries (``deploy.json``).

A hospital runs the export without fed-auc, so the file itself must score exactly as
``fed-auc evaluate`` does (``fed_auc.tta.predict``: upsampling, input normalization, sigmoid,
the card's test-time augmentation — all inside ``Scorer``), and must say what the score means:
the positive class, the operating threshold, the calibration map, where it was validated and
how it was trained. A fact an older card did not record is said to be "not recorded".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fed_auc.exchange import MODEL_FORMAT
from fed_auc.models import INPUTS, MIN_SIDE, DenseNetClassifier
from fed_auc.registry.load import load_registered_model
from fed_auc.registry.weights import sha256
from fed_auc.tta import check_tta

DEPLOY_FORMAT = "fed-auc-deploy/1"
DEPLOY_FILE = "deploy.json"
NOT_RECORDED = "not recorded"


class Scorer(nn.Module):
    """(N, C, S, S) images in [0, 1] → (N, labels) scores, as ``fed-auc evaluate`` scores them:
    each test-time augmentation view upsampled to the network's minimum side, normalized as
    the weights expect, sigmoid of the logit, the views' mean. Scriptable (TorchScript) and
    traceable (ONNX); refuses images of another shape than the card's."""

    def __init__(self, model: DenseNetClassifier, image_size: int, tta: str) -> None:
        super().__init__()
        self.net = model.net
        self.channels = model.in_channels
        self.image_size = image_size
        side = max(image_size, MIN_SIDE)
        self.upsample = image_size < MIN_SIDE
        self.side = side
        self.normalize = model.input_norm != "unit"
        self.mean, self.std = INPUTS[model.input_norm]
        self.flip = check_tta(tta) == "flip"

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        if self.upsample:
            x = F.interpolate(x, size=[self.side, self.side], mode="bilinear", align_corners=False)
        if self.normalize:
            x = (x - self.mean) / self.std
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.channels or x.shape[2] != self.image_size:
            raise ValueError(
                "expected float images of shape (N, " + str(self.channels) + ", "
                + str(self.image_size) + ", " + str(self.image_size) + ") in [0, 1], got "
                + str(x.shape)
            )  # fmt: skip
        if x.shape[3] != self.image_size:
            raise ValueError("expected square images of side " + str(self.image_size))
        probs = [torch.sigmoid(self.net(self.prepare(x)).float())]
        if self.flip:
            probs.append(torch.sigmoid(self.net(self.prepare(x.flip(-1))).float()))
        return torch.stack(probs).mean(0)


@dataclass
class Source:
    """A registered model read for export: network, card, its file and that file's digest."""

    model: DenseNetClassifier
    card: dict[str, Any]
    file: Path
    sha256: str
    image_size: int
    tta: str

    def scorer(self) -> Scorer:
        return Scorer(self.model, self.image_size, self.tta).eval()


def read_source(model_dir: str | Path) -> Source:
    """The registered model in ``model_dir`` (a folder with ``model.pt``, or the file); refuses
    a model whose card does not say its image size (the export's fixed input shape)."""
    model_dir = Path(model_dir)
    if not model_dir.exists():
        raise ValueError(f"model {model_dir}: no such file or folder")
    model, card = load_registered_model(model_dir)
    file = model_dir / "model.pt" if model_dir.is_dir() else model_dir
    size = card.get("image_size") or torch.load(file, weights_only=True).get("image_size")
    if not size:
        raise ValueError(f"model {file}: its card records no image_size, the export's input size")
    tta = check_tta(card.get("tta") or "none")
    return Source(model, card, file, sha256(file), int(size), tta)


def check_images(source: Source, seed: int = 0, random: int = 8) -> torch.Tensor:
    """Images every export is checked on: ``random`` uniform ones and a few structured ones
    (black, white, ramps, a checkerboard, a bright disc, an asymmetric corner)."""
    s, c = source.image_size, source.model.in_channels
    gen = torch.Generator().manual_seed(seed)
    ramp = torch.linspace(0, 1, s)
    yy, xx = torch.meshgrid(ramp, ramp, indexing="ij")
    structured = [
        torch.zeros(s, s),
        torch.ones(s, s),
        xx,
        yy,
        ((torch.arange(s)[:, None] + torch.arange(s)[None, :]) % 2).float(),
        (((xx - 0.5) ** 2 + (yy - 0.5) ** 2) < 0.1).float(),
        ((xx < 0.3) & (yy < 0.3)).float(),
    ]
    fixed = torch.stack(structured)[:, None].expand(-1, c, -1, -1)
    return torch.cat([torch.rand(random, c, s, s, generator=gen), fixed]).contiguous()


def _threshold(card: dict[str, Any]) -> dict[str, Any]:
    if "threshold" not in card:
        return {"threshold": NOT_RECORDED, "rule": NOT_RECORDED}
    if not card["threshold"]:
        return {
            "threshold": None,
            "rule": "none chosen: no pooled validation scores (fed-auc evaluate uses 0.5)",
        }
    fitted = [c.get("fitted_on") for c in card.get("calibration") or [] if c.get("fitted_on")]
    where = fitted[0] if fitted else "pooled validation of the training sites"
    return {
        "threshold": dict(zip(card["label_names"], card["threshold"], strict=True)),
        "rule": f"Youden's J (sensitivity + specificity − 1) maximised on {where}",
        "applies_to": "the score (the model's output, before calibration); positive if ≥",
    }


def _calibration(card: dict[str, Any]) -> Any:
    if "calibration" not in card:
        return NOT_RECORDED
    if not card["calibration"]:
        return "none: no pooled validation scores were available to fit one"
    return card["calibration"]


def _privacy(card: dict[str, Any]) -> dict[str, Any]:
    dp = card.get("privacy", NOT_RECORDED)  # None: recorded as no DP
    return {
        "differential_privacy": "none" if dp is None else dp,
        "secure_aggregation": card.get("secure_aggregation", NOT_RECORDED),
    }


def deploy_facts(source: Source) -> dict[str, Any]:
    """The card's facts a deployment needs, in one JSON-able dict (``deploy.json``)."""
    card, model = source.card, source.model
    s, names = source.image_size, list(card["label_names"])
    mean, std = INPUTS[model.input_norm]
    sites = card.get("sites")
    views = "the image and its left-right mirror" if source.tta == "flip" else "the image as is"
    return {
        "format": DEPLOY_FORMAT,
        "model": {
            "file": source.file.name,
            "format": MODEL_FORMAT,
            "sha256": source.sha256,
            "architecture": model.config(),
        },
        "labels": names,
        "positive_class": card.get("positive_class") or NOT_RECORDED,
        "input": {
            "shape": ["N", model.in_channels, s, s],
            "dtype": "float32",
            "value_range": [0.0, 1.0],
            "image_size": s,
            "expects": f"grayscale images resized to {s}×{s} px, intensities scaled to [0, 1], "
            "channel first: what fed-auc's data pipeline produces",
            "normalization": {
                "name": model.input_norm,
                "mean": mean,
                "std": std,
                "formula": "(x - mean) / std",
                "where": "inside the model",
            },
            "upsampled_to": [MIN_SIDE, MIN_SIDE] if s < MIN_SIDE else None,
        },  # fmt: skip
        "output": {
            "shape": ["N", len(names)],
            "score": "sigmoid of the network's logit per label, averaged over the test-time "
            "augmentation views: the score `fed-auc evaluate` computes for the same image",
            "value_range": [0.0, 1.0],
            "calibrated": False,
        },
        "test_time_augmentation": {"mode": source.tta, "views": views, "inside_model": True},
        "operating_point": _threshold(card),
        "calibration": _calibration(card),
        "validation": {
            "sites": [r["site"] for r in sites] if sites else NOT_RECORDED,
            "selection": f"{card.get('selection') or 'last'} on the pooled validation split",
            "validation_auc": card.get("global_val_auc", NOT_RECORDED),
            "pooled_test_auc": card.get("global_auc", NOT_RECORDED),
            "worst_site_test_auc": card.get("worst_site_auc", NOT_RECORDED),
            "site_test_auc": {r["site"]: r["auc"] for r in sites} if sites else NOT_RECORDED,
        },
        "training": {
            key: card.get(key, NOT_RECORDED)
            for key in ("run_id", "algorithm", "loss", "rounds", "selected_round", "selected")
        },
        "privacy": _privacy(card),
        "intended_use": card.get("intended_use", NOT_RECORDED),
    }
