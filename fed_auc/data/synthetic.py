"""Procedural chest-X-ray-like hospital federation: the embedded default data of fed-auc.

Every site draws patients (anatomy, exposure, findings) from one population but images them
with its own scanner (brightness, contrast, blur, noise), at its own prevalence and size, so a
federation shows feature shift, label skew and quantity skew at once. Everything is a pure
function of the seed, so demos, tests and benchmarks are reproducible bit for bit.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fed_auc.data.base import SiteData, Split, check_name
from fed_auc.data.rendering import REFERENCE_SIZE, Scanner, apply_scanner, render_patients

FINDINGS = ("opacity", "effusion", "cardiomegaly", "nodule", "consolidation")
"""Multi-label findings, each with its own visual signature; `num_labels=L` takes the first L."""

GENERIC_FINDING = "finding"
"""Single-label default: lesion-like opacities (the same signature as "opacity")."""


_RANGES: dict[str, tuple[float, float]] = {
    "intensity_shift": (-0.5, 0.5),
    "contrast": (0.05, 4.0),
    "noise_std": (0.0, 0.5),
    "blur_sigma": (0.0, 5.0),
    "lesion_strength": (0.0, 5.0),
}


@dataclass(frozen=True)
class SiteProfile:
    """One synthetic hospital: its size, prevalence and scanner.

    prevalence is one value for every label or one value per label (in FINDINGS order).
    intensity_shift is added after contrast, contrast scales around 0.5, noise_std is the
    per-pixel Gaussian noise, blur_sigma is in pixels at 28 px, lesion_strength scales how
    conspicuous findings are (a low-dose or low-resolution scanner hides them).
    """

    name: str
    n_train: int
    n_val: int
    n_test: int
    prevalence: float | tuple[float, ...]
    intensity_shift: float = 0.0
    contrast: float = 1.0
    noise_std: float = 0.03
    blur_sigma: float = 0.0
    lesion_strength: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.prevalence, list):
            object.__setattr__(self, "prevalence", tuple(self.prevalence))
        _validate(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> SiteProfile:
        """Build a profile from plain values; errors name `source`, the field and the value."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"{source}: unknown field(s) {unknown}; valid fields are {sorted(known)}"
            )
        missing = sorted(f.name for f in fields(cls) if f.default is MISSING and f.name not in data)
        if missing:
            raise ValueError(f"{source}: missing required field(s) {missing}")
        try:
            return cls(**data)
        except ValueError as err:
            raise ValueError(f"{source}: {err}") from None

    @classmethod
    def from_toml(cls, path: str | Path) -> SiteProfile:
        """Read the `[synthetic]` table of a site TOML, with `name` at the top level.

        Other top-level keys and tables belong to the node's configuration and are left alone.
        """
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as err:
            raise ValueError(f"{path}: cannot read site config: {err}") from None
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{path}: invalid TOML: {err}") from None
        table = data.get("synthetic")
        if not isinstance(table, dict):
            raise ValueError(f"{path}: missing [synthetic] table")
        if "name" in table:
            raise ValueError(f"{path}: field 'synthetic.name': put `name` at the top level")
        if "name" not in data:
            raise ValueError(f"{path}: missing required top-level field 'name'")
        return cls.from_dict({"name": data["name"], **table}, source=str(path))

    def prevalences(self, num_labels: int) -> list[float]:
        """Prevalence of each of the first `num_labels` labels."""
        if isinstance(self.prevalence, tuple):
            if len(self.prevalence) < num_labels:
                raise ValueError(
                    f"site {self.name!r}: field 'prevalence' has {len(self.prevalence)} "
                    f"value(s) but {num_labels} label(s) were requested"
                )
            return list(self.prevalence[:num_labels])
        return [self.prevalence] * num_labels


def _field_error(name: str, value: Any, reason: str) -> ValueError:
    return ValueError(f"field '{name}' = {value!r}: {reason}")


def _check_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _field_error(name, value, "must be a number")
    if not math.isfinite(value):
        raise _field_error(name, value, "must be finite")
    return float(value)


def _validate(p: SiteProfile) -> None:
    """Reject values that would silently produce nonsense data."""
    check_name(p.name, "field 'name'")
    for name, minimum in (("n_train", 1), ("n_val", 0), ("n_test", 0)):
        value = getattr(p, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _field_error(name, value, "must be an integer")
        if value < minimum:
            raise _field_error(name, value, f"must be >= {minimum}")
    values = p.prevalence if isinstance(p.prevalence, tuple) else (p.prevalence,)
    if not values:
        raise _field_error("prevalence", p.prevalence, "must not be empty")
    for value in values:
        if not 0.0 < _check_number("prevalence", value) < 1.0:
            raise _field_error("prevalence", p.prevalence, "every value must be in (0, 1)")
    for name, (low, high) in _RANGES.items():
        value = _check_number(name, getattr(p, name))
        if not low <= value <= high:
            raise _field_error(name, value, f"must be in [{low}, {high}]")


DEFAULT_PROFILES: list[SiteProfile] = [
    # Large academic centre, reference scanner, moderate prevalence.
    SiteProfile("st_elsewhere", 600, 150, 200, (0.2, 0.12, 0.1, 0.06, 0.08)),
    # Busy city hospital: sick population, dark high-contrast scanner.
    SiteProfile(
        "county_general", 400, 100, 150, (0.35, 0.2, 0.15, 0.08, 0.18),
        intensity_shift=-0.04, contrast=1.25, noise_std=0.04, blur_sigma=0.4,
    ),
    # Small rural hospital: old, dark, flat, slightly blurry and noisy scanner; rare findings.
    SiteProfile(
        "mercy_rural", 150, 50, 100, 0.08,
        intensity_shift=-0.2, contrast=0.8, noise_std=0.04, blur_sigma=0.5,
    ),
    # Outpatient clinic: mostly healthy, slightly flat images.
    SiteProfile(
        "lakeside_clinic", 250, 60, 100, (0.1, 0.05, 0.06, 0.1, 0.04),
        intensity_shift=0.03, contrast=0.9, noise_std=0.05, blur_sigma=0.3,
    ),
    # Trauma ICU, portable unit: very sick, overexposed, small.
    SiteProfile(
        "northgate_icu", 120, 40, 80, (0.4, 0.35, 0.2, 0.05, 0.3),
        intensity_shift=0.12, contrast=1.3, noise_std=0.05, blur_sigma=0.4,
    ),
    # Imaging centre with a low-dose protocol: noisy, slightly dark.
    SiteProfile(
        "valley_imaging", 300, 80, 120, 0.25,
        intensity_shift=-0.05, contrast=1.05, noise_std=0.07, blur_sigma=0.4,
        lesion_strength=0.9,
    ),
]  # fmt: skip


def make_site(
    profile: SiteProfile,
    image_size: int = REFERENCE_SIZE,
    label_names: Sequence[str] = (GENERIC_FINDING,),
    seed: int = 0,
) -> SiteData:
    """Generate one site's train / val / test splits.

    Each split has its own generator derived from (seed, split), so changing n_train does not
    change the test images. Label names pick the visual signature (see FINDINGS).
    """
    label_names = list(label_names)
    _check_labels(label_names)
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 8:
        raise ValueError(f"image_size = {image_size!r}: must be an integer >= 8")
    prevalences = profile.prevalences(len(label_names))
    counts = {"train": profile.n_train, "val": profile.n_val, "test": profile.n_test}
    splits = {
        split: _make_split(profile, n, image_size, label_names, prevalences, _derive(seed, k))
        for k, (split, n) in enumerate(counts.items())
    }
    meta = {
        "source": "synthetic",
        "seed": int(seed),
        "image_size": image_size,
        "profile": asdict(profile),
        "prevalence": prevalences,
        "license": "CC0-1.0 (procedurally generated, no patient data)",
        "intended_use": "demos, tests and benchmarks of federated AUC maximization; not clinical",
    }
    return SiteData(profile.name, label_names=label_names, meta=meta, **splits)


MAX_SITES = 1024
"""Largest synthetic federation: the default profiles, then scanner variants of them."""


def make_synthetic_federation(
    num_sites: int = 4,
    image_size: int = REFERENCE_SIZE,
    num_labels: int = 1,
    seed: int = 0,
    profiles: Sequence[SiteProfile] | None = None,
    scale: float = 1.0,
) -> list[SiteData]:
    """The first `num_sites` profiles (DEFAULT_PROFILES unless given) as a federation.

    Beyond the default profiles come `scanner_variants` of them (up to MAX_SITES sites), so
    scale benchmarks get as many distinct hospitals as they ask for.
    num_labels = 1 gives the single generic label "finding"; more take the first FINDINGS.
    scale multiplies every split size (at least 2 images each) for quick tests.
    """
    if profiles is None:
        if not 1 <= num_sites <= MAX_SITES:
            raise ValueError(f"num_sites = {num_sites!r}: must be in [1, {MAX_SITES}]")
        extra = max(0, num_sites - len(DEFAULT_PROFILES))
        profiles = DEFAULT_PROFILES + scanner_variants(DEFAULT_PROFILES, extra, seed)
    profiles = list(profiles)
    if not 1 <= num_sites <= len(profiles):
        raise ValueError(f"num_sites = {num_sites!r}: must be in [1, {len(profiles)}]")
    if not 1 <= num_labels <= len(FINDINGS):
        raise ValueError(f"num_labels = {num_labels!r}: must be in [1, {len(FINDINGS)}]")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale = {scale!r}: must be > 0")
    return [
        federation_site(p, i, image_size, num_labels, seed, scale)
        for i, p in enumerate(profiles[:num_sites])
    ]


def federation_site(
    profile: SiteProfile,
    index: int,
    image_size: int = REFERENCE_SIZE,
    num_labels: int = 1,
    seed: int = 0,
    scale: float = 1.0,
) -> SiteData:
    """Site ``index`` of a synthetic federation: its images depend on (seed, index) only, so a
    node generating its own site gets the images ``fed-auc simulate`` generates for it."""
    label_names = [GENERIC_FINDING] if num_labels == 1 else list(FINDINGS[:num_labels])
    return make_site(_scaled(profile, scale), image_size, label_names, _derive(seed, index))


def scanner_variants(base: Sequence[SiteProfile], count: int, seed: int) -> list[SiteProfile]:
    """`count` more hospitals: variant j has the population (size, prevalence) of
    base[j % len(base)] and a scanner of its own, drawn from `seed` (brightness, contrast,
    noise, blur, lesion conspicuity within the ranges the default hospitals span)."""
    variants = []
    for j in range(count):
        origin = base[j % len(base)]
        rng = np.random.default_rng(_derive(seed, 1_000_000 + j))
        variants.append(
            replace(
                origin,
                name=f"{origin.name}_{j // len(base) + 1}",
                intensity_shift=float(rng.uniform(-0.2, 0.12)),
                contrast=float(np.exp(rng.uniform(np.log(0.8), np.log(1.3)))),
                noise_std=float(rng.uniform(0.03, 0.07)),
                blur_sigma=float(rng.uniform(0.0, 0.5)),
                lesion_strength=float(rng.uniform(0.9, 1.0)),
            )
        )
    return variants


def _scaled(profile: SiteProfile, scale: float) -> SiteProfile:
    if scale == 1.0:
        return profile
    n = {k: max(2, round(getattr(profile, k) * scale)) for k in ("n_train", "n_val", "n_test")}
    return replace(profile, **n)


def _derive(seed: int, index: int) -> int:
    """An independent 63-bit seed for child `index` of `seed`."""
    state = np.random.SeedSequence([int(seed), index]).generate_state(1, dtype=np.uint64)
    return int(state[0] >> np.uint64(1))


def _check_labels(label_names: list[str]) -> None:
    valid = (GENERIC_FINDING, *FINDINGS)
    if not label_names:
        raise ValueError("label_names must not be empty")
    for name in label_names:
        if name not in valid:
            raise ValueError(f"label name {name!r} has no visual signature; valid: {valid}")
    if len(set(label_names)) != len(label_names):
        raise ValueError(f"label_names {label_names} contain duplicates")


def _make_split(
    profile: SiteProfile,
    n: int,
    size: int,
    label_names: list[str],
    prevalences: list[float],
    seed: int,
) -> Split:
    gen = torch.Generator().manual_seed(seed)
    labels = torch.stack([_exact_labels(gen, n, p) for p in prevalences], dim=1)
    patients = render_patients(gen, labels, label_names, size, profile.lesion_strength)
    scanner = Scanner(
        profile.contrast, profile.intensity_shift, profile.blur_sigma, profile.noise_std
    )
    return Split(apply_scanner(gen, patients, scanner, size), labels)


def _exact_labels(gen: torch.Generator, n: int, prevalence: float) -> torch.Tensor:
    """round(p·n) positives at random rows, at least one of each class when n >= 2.

    Exact counts keep the prevalence of small splits on profile and every split scoreable.
    """
    k = min(max(round(prevalence * n), 1), n - 1) if n >= 2 else 0
    labels = torch.zeros(n)
    labels[torch.randperm(n, generator=gen)[:k]] = 1.0
    return labels
