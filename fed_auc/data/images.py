"""One image file to one grayscale float image in [0, 1], by stated rules, and what was done.

Scaling (the rule every file follows):

- 8-bit images (Pillow modes ``1``, ``L``, ``P``, ``RGB``, ``RGBA``, ``LA``, …): value / 255. The
  8-bit range is the image's real range, so absolute brightness is kept between images (as in
  the MedMNIST reader).
- Deeper images (16-bit PNG/TIFF, modes ``I;16``, ``I;16B``, ``I;16L``, ``I`` and float ``F``):
  by the image's own min and max, ``(v − min) / (max − min)``. A 16-bit container holds 10-,
  12-, 14- or 16-bit data and says nothing reliable about which (PNG's ``sBIT`` is optional and
  Pillow does not report it): dividing a 12-bit image by 65 535 would leave it at 1/16 of the
  range, a few gray levels once stored as 8 bits, and clipping to 8 bits (the old reader's
  ``convert('L')``) turned every pixel above 255 white. Min/max is what a viewer's automatic
  window does and what the DICOM reader does without a window; the price is that absolute
  brightness (exposure) between images is normalized away.
- DICOM: the Modality LUT (``RescaleSlope``/``RescaleIntercept``) first; then the first VOI
  window (``WindowCenter``/``WindowWidth``, ``VOILUTFunction`` LINEAR, LINEAR_EXACT or SIGMOID,
  DICOM PS3.3 C.11.2.1.2) when the file has one, else the image's own min/max; ``MONOCHROME1``
  (high values shown dark) is inverted last, so bright means dense in every image.

Colour, alpha and shape:

- Colour (RGB, palette, CMYK, YCbCr, …) becomes luminance, ITU-R 601-2 as Pillow's
  ``convert('L')``: L = 0.299 R + 0.587 G + 0.114 B.
- Alpha (RGBA, LA, transparent palettes) is composited onto black before the luminance:
  a transparent pixel carries no measurement, and black is "no signal" in a MONOCHROME2 image
  and the value padding adds, so transparency and padding look alike.
- Non-square images follow ``aspect``: ``pad`` (default: black borders on the short side,
  centred; nothing of the image is lost and anatomy keeps its proportions), ``crop`` (the
  centred square; full resolution, loses the ends of the long side) or ``stretch`` (resized to
  a square, distorting proportions; the reader's behaviour before these rules).

Checks (warnings in the data card and ``fed-auc node --check``, refusals with ``--strict``):
an image is *constant* when all its pixels have one value (std 0: nothing to learn), and
*saturated* when at least ``SATURATED_SHARE`` of its pixels sit at its brightest value or at
its darkest (clipped in acquisition or export).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

ASPECTS = ("pad", "crop", "stretch")
DEFAULT_ASPECT = "pad"
SATURATED_SHARE = 0.5
EXAMPLES = 5  # files a warning names before "and N more"

HIGH_DEPTH_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")
# Per-image facts counted in the data card (what was done to how many images) ...
FACTS = (
    "high_depth", "dicom", "rescaled", "voi_window", "monochrome1", "colour", "colour_content",
    "alpha", "non_square",
)  # fmt: skip
# ... and the two that are warnings.
PROBLEMS = ("constant", "saturated")
FLAGS = FACTS + PROBLEMS

POLICY = {
    "scaling": "8-bit: value / 255; 16-bit, 32-bit and float: the image's own min..max; "
    "DICOM: rescale slope/intercept, then the VOI window if present (else min..max), "
    "MONOCHROME1 inverted",
    "colour": "luminance, ITU-R 601-2 (0.299 R + 0.587 G + 0.114 B)",
    "alpha": "composited onto black",
}
FACT_NAMES = {
    "high_depth": "16-bit or deeper (scaled by own min..max)",
    "dicom": "DICOM",
    "rescaled": "DICOM with rescale slope/intercept",
    "voi_window": "DICOM with a VOI window (applied)",
    "monochrome1": "DICOM MONOCHROME1 (inverted)",
    "colour": "stored in colour (made luminance)",
    "colour_content": "with colour content (channels differ: overlays, annotations?)",
    "alpha": "with alpha (composited onto black)",
    "non_square": "non-square",
}


class BadImageError(ValueError):
    """An image file that is missing or cannot be decoded."""


@dataclass
class ImageFacts:
    """What reading one file found and did (the flags of `FLAGS` that are true)."""

    flags: set[str] = field(default_factory=set)


def validate_aspect(aspect: str, where: str = "aspect") -> str:
    if aspect not in ASPECTS:
        raise ValueError(f"{where} = {aspect!r}: must be one of {list(ASPECTS)}")
    return aspect


def read_image(path: Path, size: int | None, aspect: str = DEFAULT_ASPECT) -> torch.Tensor:
    """One grayscale image as float32 (1, size, size) in [0, 1]; DICOM by suffix .dcm."""
    return read_image_facts(path, size, aspect)[0]


def read_image_facts(
    path: Path, size: int | None, aspect: str = DEFAULT_ASPECT
) -> tuple[torch.Tensor, ImageFacts]:
    """`read_image` and the facts about the file (depth, colour, alpha, shape, problems)."""
    validate_aspect(aspect)
    path = Path(path)
    if not path.is_file():
        raise BadImageError(f"image {path} not found")
    facts = ImageFacts()
    try:
        if path.suffix.lower() == ".dcm":
            pixels = dicom_pixels(path, facts)
        else:
            with Image.open(path) as img:
                pixels = pil_pixels(img, facts)
    except BadImageError:
        raise
    except Exception as exc:  # noqa: BLE001 - decoders raise anything (OSError, SyntaxError,
        # struct.error, EOFError, zlib.error, DecompressionBombError, ...): one clear error
        raise BadImageError(f"cannot read image {path}: {type(exc).__name__}: {exc}") from None
    if pixels.ndim != 2 or min(pixels.shape) == 0:
        raise BadImageError(f"cannot read image {path}: pixel array shape {pixels.shape}")
    if not np.isfinite(pixels).all():
        raise BadImageError(f"cannot read image {path}: NaN or infinite pixel values")
    facts.flags |= problems(pixels)
    if pixels.shape[0] != pixels.shape[1]:
        facts.flags.add("non_square")
    image = torch.from_numpy(np.ascontiguousarray(square(pixels, aspect), dtype=np.float32))
    return resize(image[None, None], size)[0], facts


def pil_pixels(img: Image.Image, facts: ImageFacts) -> np.ndarray:
    """A Pillow image to float32 (H, W) in [0, 1] by the module's rules."""
    if img.mode in HIGH_DEPTH_MODES:
        facts.flags.add("high_depth")
        return min_max(np.asarray(img).astype(np.float64))
    if img.mode in ("1", "L"):
        return np.asarray(img.convert("L"), dtype=np.float32) / 255.0
    has_alpha = img.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in img.info
    colour = img.mode not in ("LA", "La") and not (img.mode in ("P", "PA") and _grey_palette(img))
    if colour:
        facts.flags.add("colour")
    if has_alpha:
        facts.flags.add("alpha")
        rgba = img.convert("RGBA")
        black = Image.new("RGBA", rgba.size, (0, 0, 0, 255))
        rgb = Image.alpha_composite(black, rgba).convert("RGB")
    else:
        rgb = img.convert("RGB")
    if colour:
        channels = np.asarray(rgb)
        if (channels[..., 0] != channels[..., 1]).any() or (
            channels[..., 1] != channels[..., 2]
        ).any():
            facts.flags.add("colour_content")
    return np.asarray(rgb.convert("L"), dtype=np.float32) / 255.0


def _grey_palette(img: Image.Image) -> bool:
    palette = np.asarray(img.getpalette() or [], dtype=np.int32).reshape(-1, 3)
    return bool(len(palette)) and bool(
        (palette[:, 0] == palette[:, 1]).all() and (palette[:, 1] == palette[:, 2]).all()
    )


def dicom_pixels(path: Path, facts: ImageFacts) -> np.ndarray:
    """A grayscale DICOM to float32 (H, W) in [0, 1]: modality LUT, VOI window, MONOCHROME1."""
    import pydicom
    from pydicom.pixels import apply_modality_lut

    facts.flags.add("dicom")
    ds = pydicom.dcmread(path)
    raw = ds.pixel_array
    if raw.ndim != 2:
        raise BadImageError(
            f"cannot read image {path}: expected a 2-D grayscale DICOM, pixel array shape "
            f"{raw.shape}"
        )
    if "RescaleSlope" in ds or "RescaleIntercept" in ds or "ModalityLUTSequence" in ds:
        facts.flags.add("rescaled")
    values = np.asarray(apply_modality_lut(raw, ds), dtype=np.float64)
    window = _window(ds, path)
    if window is None:
        pixels = min_max(values)
    else:
        facts.flags.add("voi_window")
        pixels = apply_window(values, *window)
    if getattr(ds, "PhotometricInterpretation", "") == "MONOCHROME1":
        facts.flags.add("monochrome1")
        pixels = 1.0 - pixels  # MONOCHROME1 shows high values dark
    return pixels.astype(np.float32)


def _window(ds: Any, path: Path) -> tuple[float, float, str] | None:
    if "WindowCenter" not in ds or "WindowWidth" not in ds:
        return None
    center, width = ds.WindowCenter, ds.WindowWidth
    center = float(center[0] if _multi(center) else center)
    width = float(width[0] if _multi(width) else width)
    function = str(getattr(ds, "VOILUTFunction", "LINEAR") or "LINEAR").upper()
    if function not in ("LINEAR", "LINEAR_EXACT", "SIGMOID"):
        raise BadImageError(f"cannot read image {path}: VOILUTFunction {function!r} unknown")
    low = 1.0 if function == "LINEAR" else 0.0
    if not np.isfinite(center) or not np.isfinite(width) or width < low or width <= 0:
        raise BadImageError(
            f"cannot read image {path}: WindowWidth {width} (center {center}) is not a window"
        )
    return center, width, function


def _multi(value: Any) -> bool:
    return isinstance(value, list | tuple) or type(value).__name__ == "MultiValue"


def apply_window(values: np.ndarray, center: float, width: float, function: str) -> np.ndarray:
    """DICOM PS3.3 C.11.2.1.2 VOI window onto [0, 1]."""
    if function == "SIGMOID":
        return 1.0 / (1.0 + np.exp(-4.0 * (values - center) / width))
    if function == "LINEAR_EXACT":
        return np.clip((values - center) / width + 0.5, 0.0, 1.0)
    if width == 1:  # LINEAR with width 1: a threshold at center - 0.5
        return (values > center - 0.5).astype(np.float64)
    return np.clip((values - (center - 0.5)) / (width - 1) + 0.5, 0.0, 1.0)


def min_max(values: np.ndarray) -> np.ndarray:
    """(v − min) / (max − min); a constant image is all zeros."""
    if not np.isfinite(values).all():
        raise ValueError("NaN or infinite pixel values")
    low, high = float(values.min()), float(values.max())
    if high <= low:
        return np.zeros(values.shape, dtype=np.float32)
    return ((values - low) / (high - low)).astype(np.float32)


def problems(pixels: np.ndarray) -> set[str]:
    """``constant`` (one value) or ``saturated`` (≥ SATURATED_SHARE at the brightest or the
    darkest value), from the scaled image at its own resolution."""
    low, high = float(pixels.min()), float(pixels.max())
    if high <= low:
        return {"constant"}
    share = max(float((pixels == high).mean()), float((pixels == low).mean()))
    return {"saturated"} if share >= SATURATED_SHARE else set()


def square(pixels: np.ndarray, aspect: str) -> np.ndarray:
    """The image made square by `aspect`: pad (black, centred), crop (centred) or stretch
    (left to the resize)."""
    h, w = pixels.shape
    if h == w or aspect == "stretch":
        return pixels
    if aspect == "crop":
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        return pixels[top : top + side, left : left + side]
    side = max(h, w)
    out = np.zeros((side, side), dtype=pixels.dtype)
    top, left = (side - h) // 2, (side - w) // 2
    out[top : top + h, left : left + w] = pixels
    return out


def image_report(
    flags: dict[str, np.ndarray], files: np.ndarray, rows: np.ndarray, aspect: str
) -> dict[str, Any]:
    """What the data card says about the images of `rows`: the policy, how many images each
    rule touched, and warnings naming the constant and saturated files."""
    rows = np.asarray(rows, dtype=np.int64)
    counts = {FACT_NAMES[k]: int(flags[k][rows].sum()) for k in FACTS if k in flags}
    report: dict[str, Any] = {
        "policy": {**POLICY, "aspect": aspect},
        "read": int(len(rows)),
        "counts": {k: v for k, v in counts.items() if v},
        "constant": int(flags["constant"][rows].sum()) if "constant" in flags else 0,
        "saturated": int(flags["saturated"][rows].sum()) if "saturated" in flags else 0,
        "warnings": [],
    }
    for name, what in (
        ("constant", "constant image(s) (every pixel the same value, std 0)"),
        (
            "saturated",
            f"saturated image(s) (≥ {SATURATED_SHARE:.0%} of pixels at the brightest or the "
            "darkest value)",
        ),
    ):
        hit = rows[flags[name][rows]] if name in flags else rows[:0]
        if len(hit):
            named = ", ".join(str(files[r]) for r in hit[:EXAMPLES])
            more = f" and {len(hit) - EXAMPLES} more" if len(hit) > EXAMPLES else ""
            report["warnings"].append(f"{len(hit)} of {len(rows)} {what}: {named}{more}")
    return report


def resize(images: torch.Tensor, size: int | None) -> torch.Tensor:
    """Square-resize (N, 1, H, W) images to `size` (antialiased bilinear); None keeps them."""
    if size is None or tuple(images.shape[-2:]) == (size, size):
        return images
    return F.interpolate(
        images, size=(size, size), mode="bilinear", align_corners=False, antialias=True
    ).clamp(0, 1)
