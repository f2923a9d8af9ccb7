"""The procedural chest-X-ray renderer behind the synthetic data: anatomy, findings and each site's
scanner (``render_patients``, ``apply_scanner``), a pure function of the generator it is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

REFERENCE_SIZE = 28
"""`blur_sigma` and `noise_std` are given for 28 px images and scaled with image_size."""
# Appearance of the population (intensities before the scanner, in [0, 1]).
_BACKGROUND, _SOFT_TISSUE, _LUNG, _SPINE = 0.05, 0.62, 0.30, 0.10
_RIB_AMPLITUDE, _TEXTURE_AMPLITUDE = 0.05, 0.05
_EXPOSURE_GAIN_STD, _EXPOSURE_OFFSET_STD, _LUNG_LEVEL_STD = 0.08, 0.04, 0.05
_POSITION_STD = 0.05  # patient placement, as a fraction of the half-width
# Peak lesion brightness at lesion_strength 1 (tuned in benchmarks/systems/synthetic_difficulty.py).
_AMPLITUDE = {"opacity": 0.4, "effusion": 0.25, "nodule": 0.6, "consolidation": 0.2}


def _uniform(gen: torch.Generator, shape: tuple[int, ...], low: float, high: float) -> torch.Tensor:
    return low + (high - low) * torch.rand(shape, generator=gen)


def _normal(gen: torch.Generator, shape: tuple[int, ...], std: float) -> torch.Tensor:
    return std * torch.randn(shape, generator=gen)


def _soft_ellipse(
    x: torch.Tensor,
    y: torch.Tensor,
    center: tuple[torch.Tensor, torch.Tensor],
    axes: tuple[torch.Tensor, torch.Tensor],
    edge: float,
) -> torch.Tensor:
    """1 inside the ellipse, 0 outside, with a soft rim so small images do not alias."""
    r = torch.sqrt(((x - center[0]) / axes[0]) ** 2 + ((y - center[1]) / axes[1]) ** 2)
    return torch.sigmoid((1.0 - r) * edge)


@dataclass
class _Lungs:
    """Per-patient lung geometry, (n, 2, 1, 1) each: index 0 = image left, 1 = image right."""

    cx: torch.Tensor
    cy: torch.Tensor
    ax: torch.Tensor
    ay: torch.Tensor
    masks: torch.Tensor  # (n, 2, S, S)


def render_patients(
    gen: torch.Generator,
    labels: torch.Tensor,
    label_names: list[str],
    size: int,
    lesion_strength: float,
) -> torch.Tensor:
    """Patients as the ideal scanner would see them: (n, 1, S, S), roughly in [0, 1]."""
    n = labels.shape[0]
    x, y = _patient_coordinates(gen, n, size)
    body_center = (_normal(gen, (n, 1, 1, 1), 0.03), 0.1 + _normal(gen, (n, 1, 1, 1), 0.03))
    body_width = 0.86 * (1.0 + _normal(gen, (n, 1, 1, 1), 0.04))
    body = _soft_ellipse(x, y, body_center, (body_width, torch.tensor(1.05)), edge=10.0)
    lungs = _draw_lungs(gen, x, y)
    enlargement = _heart_enlargement(gen, labels, label_names, lesion_strength)
    heart = _draw_heart(gen, x, y, enlargement)
    lung = lungs.masks.sum(1, keepdim=True).clamp(max=1.0) * (1.0 - heart)
    lung_level = _LUNG + _normal(gen, (n, 1, 1, 1), _LUNG_LEVEL_STD)  # depth of inspiration
    image = _BACKGROUND + (_SOFT_TISSUE - _BACKGROUND) * body
    image = image + _SPINE * torch.exp(-((x / 0.09) ** 2)) * body
    image = image - (_SOFT_TISSUE - lung_level) * lung
    image = image + _RIB_AMPLITUDE * _ribs(gen, x, y) * (lung + 0.3 * body)
    image = image + _TEXTURE_AMPLITUDE * _smooth_field(gen, n, size) * lung
    for j, name in enumerate(label_names):
        if name != "cardiomegaly":
            finding = _finding(gen, name, labels[:, j] == 1, x, y, lungs)
            image = image + lesion_strength * finding * lung
    gain = 1.0 + _normal(gen, (n, 1, 1, 1), _EXPOSURE_GAIN_STD)
    return image * gain + _normal(gen, (n, 1, 1, 1), _EXPOSURE_OFFSET_STD)


def _patient_coordinates(
    gen: torch.Generator, n: int, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Image grid in [-1, 1] shifted and rotated by each patient's positioning error."""
    c = torch.linspace(-1.0, 1.0, size)
    gy, gx = torch.meshgrid(c, c, indexing="ij")
    gx = gx - _normal(gen, (n, 1, 1, 1), _POSITION_STD)
    gy = gy - _normal(gen, (n, 1, 1, 1), _POSITION_STD)
    theta = _uniform(gen, (n, 1, 1, 1), -0.08, 0.08)
    cos, sin = torch.cos(theta), torch.sin(theta)
    return gx * cos + gy * sin, -gx * sin + gy * cos


def _draw_lungs(gen: torch.Generator, x: torch.Tensor, y: torch.Tensor) -> _Lungs:
    n = x.shape[0]
    side = torch.tensor([-1.0, 1.0]).view(1, 2, 1, 1)
    cx = side * (0.38 + _normal(gen, (n, 2, 1, 1), 0.03))
    cy = -0.06 + _normal(gen, (n, 1, 1, 1), 0.04) + _normal(gen, (n, 2, 1, 1), 0.015)
    ax = 0.25 * (1.0 + _normal(gen, (n, 2, 1, 1), 0.07))
    ay = 0.6 * (1.0 + _normal(gen, (n, 1, 1, 1), 0.07))
    masks = _soft_ellipse(x, y, (cx, cy), (ax, ay), edge=12.0)
    return _Lungs(cx, cy, ax, ay, masks)


def _heart_enlargement(
    gen: torch.Generator, labels: torch.Tensor, label_names: list[str], lesion_strength: float
) -> torch.Tensor:
    """Heart width factor: 1 unless the patient is positive for cardiomegaly."""
    factor = 1.0 + lesion_strength * _uniform(gen, (labels.shape[0],), 0.25, 0.45)
    if "cardiomegaly" not in label_names:
        return torch.ones_like(factor)
    positive = labels[:, label_names.index("cardiomegaly")] == 1
    return torch.where(positive, factor, torch.ones_like(factor))


def _draw_heart(
    gen: torch.Generator, x: torch.Tensor, y: torch.Tensor, enlargement: torch.Tensor
) -> torch.Tensor:
    n = x.shape[0]
    center = (0.1 + _normal(gen, (n, 1, 1, 1), 0.03), 0.3 + _normal(gen, (n, 1, 1, 1), 0.03))
    width = 0.27 * (1.0 + _normal(gen, (n, 1, 1, 1), 0.08)) * enlargement.view(n, 1, 1, 1)
    height = 0.22 * (1.0 + _normal(gen, (n, 1, 1, 1), 0.06))
    return _soft_ellipse(x, y, center, (width, height), edge=10.0)


def _ribs(gen: torch.Generator, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Curved periodic stripes with per-patient spacing and phase."""
    n = x.shape[0]
    frequency = _uniform(gen, (n, 1, 1, 1), 3.4, 4.2)
    phase = _uniform(gen, (n, 1, 1, 1), 0.0, 2 * math.pi)
    return torch.sin(2 * math.pi * frequency * (y + 0.3 * x**2) + phase)


def _smooth_field(gen: torch.Generator, n: int, size: int) -> torch.Tensor:
    """Smooth zero-mean random field (vessel markings), a natural look-alike of faint lesions."""
    coarse = torch.randn((n, 1, 6, 6), generator=gen)
    return F.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=False)


def _finding(
    gen: torch.Generator,
    name: str,
    positive: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    lungs: _Lungs,
) -> torch.Tensor:
    """Additive brightness of one finding (zero for negatives), before the lung mask."""
    gate = positive.float().view(-1, 1, 1, 1)
    if name == "effusion":
        return gate * _effusion(gen, x, y, lungs)
    if name == "nodule":
        field = _blobs(gen, x, y, lungs, max_count=1, sigma=(0.045, 0.075))
    elif name == "consolidation":
        field = (1.6 * _blobs(gen, x, y, lungs, max_count=1, sigma=(0.16, 0.26))).clamp(max=1.0)
    else:  # opacity and the generic finding
        name = "opacity"
        field = _blobs(gen, x, y, lungs, max_count=3, sigma=(0.07, 0.15))
    return gate * _AMPLITUDE[name] * field


def _blobs(
    gen: torch.Generator,
    x: torch.Tensor,
    y: torch.Tensor,
    lungs: _Lungs,
    max_count: int,
    sigma: tuple[float, float],
) -> torch.Tensor:
    """1..max_count soft Gaussian blobs per image, centred inside a random lung, peak <= 1."""
    n, k = x.shape[0], max_count
    side = (torch.rand((n, k), generator=gen) < 0.5).long().view(n, k, 1, 1)
    cx, cy = lungs.cx.expand(n, 2, 1, 1), lungs.cy.expand(n, 2, 1, 1)
    ax, ay = lungs.ax.expand(n, 2, 1, 1), lungs.ay.expand(n, 2, 1, 1)
    radius = 0.75 * torch.sqrt(torch.rand((n, k, 1, 1), generator=gen))
    angle = _uniform(gen, (n, k, 1, 1), 0.0, 2 * math.pi)
    bx = cx.gather(1, side) + radius * torch.cos(angle) * ax.gather(1, side)
    by = cy.gather(1, side) + radius * torch.sin(angle) * ay.gather(1, side)
    s = _uniform(gen, (n, k, 1, 1), *sigma)
    strength = _uniform(gen, (n, k, 1, 1), 0.6, 1.0)
    count = torch.randint(1, k + 1, (n, 1, 1, 1), generator=gen)
    present = (torch.arange(k).view(1, k, 1, 1) < count).float()
    blob = torch.exp(-((x - bx) ** 2 + (y - by) ** 2) / (2 * s**2))
    return (present * strength * blob).sum(1, keepdim=True).clamp(max=1.0)


def _effusion(
    gen: torch.Generator, x: torch.Tensor, y: torch.Tensor, lungs: _Lungs
) -> torch.Tensor:
    """Fluid filling the base of one or both lungs, its meniscus rising laterally."""
    n = x.shape[0]
    which = torch.randint(0, 3, (n, 1, 1, 1), generator=gen)  # 0 left, 1 right, 2 both
    sides = torch.cat([(which != 1), (which != 0)], dim=1).float()  # (n, 2, 1, 1)
    depth = _uniform(gen, (n, 2, 1, 1), 0.2, 0.4)
    strength = _uniform(gen, (n, 1, 1, 1), 0.6, 1.0)
    lateral = torch.relu((x - lungs.cx) * torch.sign(lungs.cx) / lungs.ax)
    level = lungs.cy + lungs.ay * (1.0 - 2.0 * depth) - 0.25 * lungs.ay * lateral
    fluid = torch.sigmoid((y - level) * 30.0) * lungs.masks * sides
    return _AMPLITUDE["effusion"] * strength * fluid.sum(1, keepdim=True).clamp(max=1.0)


@dataclass(frozen=True)
class Scanner:
    """A site's acquisition (``SiteProfile``'s scanner fields, at 28 px)."""

    contrast: float
    intensity_shift: float
    blur_sigma: float
    noise_std: float


def apply_scanner(
    gen: torch.Generator, patients: torch.Tensor, scanner: Scanner, size: int
) -> torch.Tensor:
    """The site's acquisition: contrast, brightness, blur, noise, then the [0, 1] window.

    Blur and noise are given at 28 px and scaled with the resolution (smaller pixels catch
    fewer photons), so a lesion's signal-to-noise ratio does not depend on image_size. Noise
    is always drawn, so the same seed images the same patients on every scanner.
    """
    zoom = size / REFERENCE_SIZE
    image = (patients - 0.5) * scanner.contrast + 0.5 + scanner.intensity_shift
    image = _gaussian_blur(image, scanner.blur_sigma * zoom)
    noise = torch.randn(image.shape, generator=gen)
    return (image + scanner.noise_std * zoom * noise).clamp(0.0, 1.0).contiguous()


def _gaussian_blur(image: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur by conv2d; edge pixels are replicated, not darkened."""
    if sigma < 1e-3:
        return image
    radius = max(1, math.ceil(3 * sigma))
    offsets = torch.arange(-radius, radius + 1, dtype=image.dtype)
    kernel = torch.exp(-(offsets**2) / (2 * sigma**2))
    kernel = kernel / kernel.sum()
    padded = F.pad(image, (radius, radius, radius, radius), mode="replicate")
    blurred = F.conv2d(padded, kernel.view(1, 1, 1, -1))
    return F.conv2d(blurred, kernel.view(1, 1, -1, 1))
