"""Data cards: what each site's data is, in numbers and words (Markdown + JSON).

Per site and split: counts, positives, unknowns and prevalence per label; image size and
intensity statistics; patient count; source, license, intended use and known limits. The
same dict is the site summary the run store keeps (`sites` table).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from fed_auc.data.base import SiteData
from fed_auc.data.labels import positive_class_text, positive_classes
from fed_auc.data.memmap import Images, chunks
from fed_auc.data.pool import SPLITS
from fed_auc.io import save_json, save_text

QUANTILE_PIXELS = 1_000_000  # the percentiles' sample: the first pixels of the split
SYNTHETIC_NOTE = {
    "intended_use": "Demonstration and testing of federated AUC maximization.",
    "limits": [
        "Procedural images: results say nothing about real X-rays.",
        "Site differences (prevalence, scanner shift, size) are chosen, not measured.",
    ],
}
FILE_NOTE = {
    "intended_use": "Research on federated AUC maximization; not for clinical decisions.",
    "limits": [
        "Sites made by a partitioner are simulated hospitals, not real ones.",
        "Labels are as given by the source (no re-reading); uncertain labels follow the "
        "chosen policy.",
    ],
}

SITE_FILE_NOTE = {
    "intended_use": FILE_NOTE["intended_use"],
    "limits": [
        "One site's own images, as its site file names them (splits: see Details).",
        FILE_NOTE["limits"][1],
    ],
}


def site_positive_class(site: SiteData) -> list[str]:
    """Per label, the class a site's AUCs are about: its file's name, else derived."""
    return site.meta.get("positive_class") or positive_classes(site.label_names)


def data_card(site: SiteData) -> dict[str, Any]:
    """The card of one site as a JSON-able dict."""
    meta = dict(site.meta)
    note = SYNTHETIC_NOTE if meta.get("source") == "synthetic" else FILE_NOTE
    if "splits" in meta:  # fed_auc.data.spec.site_from_config: a site file's own data
        note = SITE_FILE_NOTE
    images = meta.pop("images", None)
    meta.pop("aspect", None)  # in the images' policy
    meta.pop("positive_class", None)  # site_positive_class
    card: dict[str, Any] = {
        "site": site.name,
        "source": meta.pop("source", "unknown"),
        "license": meta.pop("license", "see the source dataset"),
        "label_names": list(site.label_names),
        # what every AUC and sensitivity of this site is about (fed_auc.data.labels)
        "positive_class": site_positive_class(site),
        # a site file's data spec and the SHA-256 of its data file (None: generated/partitioned)
        "data_spec": meta.pop("data_spec", None),
        "sha256": meta.pop("data_sha256", None),
        "image_size": list(site.train.images.shape[-2:]),
        "patients": meta.pop("patients", None),
        "skipped_images": meta.pop("skipped_images", 0),
        "splits": {name: split_stats(getattr(site, name)) for name in SPLITS},
        "intended_use": meta.pop("intended_use", note["intended_use"]),
        "limits": list(note["limits"]),
        "images": images,  # image files: how they were read (fed_auc.data.images); else None
        "warnings": list(images["warnings"]) if images else [],
        "details": meta,
    }
    return card


def card_warnings(site: SiteData) -> list[str]:
    """The warnings of a site's card (constant or saturated image files), one line each."""
    images = site.meta.get("images") or {}
    return list(images.get("warnings", []))


def split_stats(split) -> dict[str, Any]:
    """Counts, prevalence per label and intensity statistics of one split."""
    n = len(split)
    known, positives = split.known(), split.positives()
    return {
        "n": n,
        "positives": positives,
        "known": known,
        "prevalence": [p / k if k else None for p, k in zip(positives, known, strict=True)],
        "intensity": None if n == 0 else intensity(split.images),
    }


def intensity(pixels: Images) -> dict[str, float]:
    """Mean and standard deviation of every pixel; 5th and 95th percentiles of the first
    ``QUANTILE_PIXELS``. A cached split is read chunk by chunk (sums in float64), never whole."""
    if isinstance(pixels, torch.Tensor):
        mean, std = float(pixels.mean()), float(pixels.std()) if pixels.numel() > 1 else 0.0
        head = pixels.flatten()[:QUANTILE_PIXELS]
    else:
        total = square = 0.0
        first: list[torch.Tensor] = []
        for chunk in chunks(pixels, 32, workers=0):  # 32 images: a few MB at a time
            total += float(chunk.sum(dtype=torch.float64))
            square += float(chunk.square().sum(dtype=torch.float64))
            room = QUANTILE_PIXELS - sum(len(part) for part in first)
            if room > 0:
                first.append(chunk.flatten()[:room])
        count = pixels.numel()
        mean = total / count
        std = math.sqrt(max(0.0, square - count * mean**2) / (count - 1)) if count > 1 else 0.0
        head = torch.cat(first)
    return {
        "mean": mean,
        "std": std,
        "p05": float(torch.quantile(head, 0.05)),
        "p95": float(torch.quantile(head, 0.95)),
    }


def render_data_card(card: dict[str, Any]) -> str:
    """The card as Markdown."""
    lines = [
        f"# Data card — {card['site']}",
        "",
        f"- Source: `{card['source']}`",
        *([f"- Data file SHA-256: `{card['sha256']}`"] if card.get("sha256") else []),
        f'- Positive class: {positive_class_text(card.get("positive_class"))} (the "positives" '
        "and prevalence below count it)",
        f"- License: {card['license']}",
        f"- Image size: {card['image_size'][0]}×{card['image_size'][1]} px, 1 channel, "
        "intensities in [0, 1]",
        f"- Patients: {card['patients'] if card['patients'] is not None else 'no patient ids'}",
        f"- Unreadable images skipped: {card['skipped_images']}",
        "",
        "| split | n | label | positives | known | prevalence | mean intensity | std |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in card["splits"].items():
        stats = s["intensity"] or {}
        for j, label in enumerate(card["label_names"]):
            prev = s["prevalence"][j]
            lines.append(
                f"| {name} | {s['n']} | {label} | {s['positives'][j]} | {s['known'][j]} | "
                f"{'—' if prev is None else f'{prev:.3f}'} | {_num(stats.get('mean'))} | "
                f"{_num(stats.get('std'))} |"
            )
    if card.get("warnings"):
        lines += ["", "## Warnings", "", *[f"- **{w}**" for w in card["warnings"]]]
    if card.get("images"):
        lines += ["", *_image_lines(card["images"])]
    lines += ["", "## Intended use", "", card["intended_use"], "", "## Known limits", ""]
    lines += [f"- {item}" for item in card["limits"]]
    if card["details"]:
        lines += ["", "## Details", "", *[f"- {k}: {v}" for k, v in card["details"].items()]]
    return "\n".join(lines) + "\n"


def write_cards(sites: list[SiteData], out_dir: str | Path) -> list[Path]:
    """``<site>.json`` and ``<site>.md`` per site; returns the Markdown paths."""
    out_dir = Path(out_dir)
    paths = []
    for site in sites:
        card = data_card(site)
        save_json(card, out_dir / f"{site.name}.json")
        paths.append(out_dir / f"{site.name}.md")
        save_text(render_data_card(card), paths[-1])
    return paths


def _image_lines(images: dict[str, Any]) -> list[str]:
    """How the image files were read: the policy and how many images each rule touched."""
    policy = images["policy"]
    lines = [
        "## Images",
        "",
        f"{images['read']} image file(s) read into 1 channel, intensities in [0, 1]:",
        "",
        f"- Scaling: {policy['scaling']}",
        f"- Colour: {policy['colour']}",
        f"- Alpha: {policy['alpha']}",
        f"- Non-square: {policy['aspect']}",
        "",
    ]
    if images["counts"]:
        lines += ["| images | count |", "|---|---|"]
        lines += [f"| {name} | {count} |" for name, count in images["counts"].items()]
    else:
        lines.append("Every image was 8-bit grayscale and square: no rule above applied.")
    lines.append(f"\nConstant images: {images['constant']}; saturated: {images['saturated']}.")
    return lines


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def data_record(cards: list[dict[str, Any]], site_files: bool) -> dict[str, Any]:
    """What a run really ran on, for its recorded config: the number of sites that took part,
    each site's data spec, data-file SHA-256 and positive class, and for site files (always
    over Flower) ``data = "site files"`` with the site files' paths as the sites reported them.
    In-process and Flower runs on the same site files record the same values."""
    record: dict[str, Any] = {
        "sites": len(cards),
        "site_data": {
            c["site"]: {
                "spec": c.get("data_spec") or c.get("source"),
                "sha256": c.get("sha256"),
                "positive_class": c.get("positive_class"),
            }
            for c in cards
        },
    }
    if site_files:
        record["data"] = SITE_FILES
        paths = [(c.get("details") or {}).get("site_file") or c.get("site_file") for c in cards]
        record["site_files"] = paths if all(paths) else None
    return record


SITE_FILES = "site files"  # the recorded ``data`` of a run whose sites are site files


def site_summary(site: SiteData) -> dict[str, Any]:
    """The data-card summary of a site kept in the store: the card, with each split's
    counts and intensity also at the top level (``train``, ``val``, ``test``)."""
    card = data_card(site)
    summary: dict[str, Any] = {**site.meta, **card}
    for name, stats in card["splits"].items():
        intensity = stats["intensity"] or {}
        summary[name] = {
            **stats,
            "intensity_mean": intensity.get("mean"),
            "intensity_std": intensity.get("std"),
        }
    return summary
