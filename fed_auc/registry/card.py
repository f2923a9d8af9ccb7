"""The model card: what a model is, how it was trained, on which sites, for which positive class
and with which privacy; JSON and Markdown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from fed_auc.data.labels import federation_positive_class, positive_class_text
from fed_auc.data.partition import PARTITION_FILE
from fed_auc.metrics.wording import selected_text
from fed_auc.store.records import as_float, as_int


def render_model_card(card: dict[str, Any]) -> str:
    """The model card as Markdown for people."""
    lines = [
        f"# Model card — run {card['run_id']}",
        "",
        f"- Algorithm: `{card['algorithm']}`, loss `{card['loss']}`, "
        f"architecture `{card['model_config']['arch']}`, labels {card['label_names']}",
        f"- Rounds: {card['rounds']} (after {card.get('warmup_rounds', 0)} fedavg + "
        f"cross-entropy warm-up rounds), sites: {len(card['sites'])}, seed {card['seed']}",
        f"- Exported model: {_exported(card)} "
        f"(selection: {card.get('selection', 'last')}; validation AUC "
        f"{_fmt(card.get('global_val_auc'))}); operating threshold per label "
        f"{[round(t, 3) for t in card.get('threshold') or [0.5]]}; test-time augmentation "
        f"`{card.get('tta', 'none')}`",
        *_stopped_line(card),
        *_calibration_line(card),
        f"- Positive class: {positive_class_text(card.get('positive_class'))} (every AUC, "
        "sensitivity and threshold on this card is for it)",
        f"- Pooled test AUC: {_fmt(card['global_auc'])} (round 0{_after_warmup(card)}: "
        f"{_fmt(card['initial_auc'])}); "
        f"worst site: {_fmt(card['worst_site_auc'])}",
        "",
        "## Hyperparameters",
        "",
        *[f"- {k}: {v}" for k, v in card["hyperparameters"].items()],
        "",
        "## Per-site test AUC of the exported global model",
        "",
        "| site | n train | train positives | n test | test AUC | 95 % CI |",
        "|---|---|---|---|---|---|",
    ]
    for s in card["sites"]:
        ci = f"{_fmt(s['auc_lo'])}–{_fmt(s['auc_hi'])}" if s["auc_lo"] is not None else "—"
        lines.append(
            f"| {s['site']} | {s['n']} | {s['positives']} | {s['n_test']} | {_fmt(s['auc'])} "
            f"| {ci} |"
        )
    lines += _init_lines(card.get("init"))
    lines += _privacy_lines(card.get("privacy"))
    lines += _compute_lines(card.get("compute"))
    lines += [
        "",
        "## Training data",
        "",
        card["data_description"],
        "",
        *_data_lines(card.get("data_cards", [])),
        "## Intended use",
        "",
        card["intended_use"],
        "",
        "## Limitations",
        "",
        *[f"- {item}" for item in card["limitations"]],
        "",
    ]
    return "\n".join(lines)


PEAKS = ("host_peak_mib", "device_peak_mib")


def compute_card(site_rounds: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per site, where it trained (device and precision of its last recorded round) and
    what it cost over the run: median images per second, the highest peak memories."""
    out: dict[str, dict[str, Any]] = {}
    for row in site_rounds.itertuples():
        metrics = json.loads(row.metrics) if isinstance(row.metrics, str) else {}
        compute = metrics.get("compute")
        if compute:
            out.setdefault(row.site, {"rounds": []})["rounds"].append(compute)
    for seen in out.values():
        rounds = seen.pop("rounds")
        seen.update(device=rounds[-1].get("device"), precision=rounds[-1].get("precision"))
        rates = [r["images_per_s"] for r in rounds if "images_per_s" in r]
        seen["images_per_s"] = float(np.median(rates)) if rates else None
        for key in PEAKS:
            peaks = [r[key] for r in rounds if key in r]
            seen[key] = max(peaks) if peaks else None
    return out


def _compute_lines(compute: dict[str, dict[str, Any]] | None) -> list[str]:
    if not compute:
        return []
    lines = [
        "",
        "## Compute per site",
        "",
        "| site | device | precision | images/s (median) | host peak MiB | device peak MiB |",
        "|---|---|---|---|---|---|",
    ]
    for site, c in compute.items():
        cells = [site, str(c.get("device")), str(c.get("precision"))]
        cells += [_fmt_number(c.get(k)) for k in ("images_per_s", *PEAKS)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _fmt_number(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _init_lines(init: dict[str, Any] | None) -> list[str]:
    """Where round 0's weights came from and what of them the model got."""
    if not init:
        return ["", "## Starting weights", "", "- Random (seeded); input normalization `unit`"]
    lines = [
        "", "## Starting weights", "",
        f"- {init['format']} file `{init['path']}`, SHA-256 `{init['sha256']}`",
        f"- Input normalization `{init['input']}` (applied inside the exported model); "
        f"classifier {init['classifier']}",
    ]  # fmt: skip
    for what in ("loaded", "converted", "replaced", "initialized"):
        names = init[what]
        shown = ", ".join(f"`{n}`" for n in names[:6]) + (" …" if len(names) > 6 else "")
        lines.append(f"- {what}: {len(names)} tensors{': ' + shown if names else ''}")
    return lines


def _privacy_lines(privacy: dict[str, Any] | None) -> list[str]:
    """The DP section: each site's (ε, δ) from its own accountant, per example (DP-SGD) or per
    site (update-level), or update-level clipping without noise (which has no ε)."""
    if not privacy:
        return []
    if privacy.get("sites") is None:
        return ["", "## Privacy", "",
                f"- Update-level clipping to {privacy['clip']} without noise: no DP guarantee, "
                "no ε"]  # fmt: skip
    example = privacy["mode"] == "example"
    title = "example-level DP-SGD" if example else "update-level DP, site-level ε"
    calibrated = "σ calibrated per site" if example else "σ calibrated for the planned rounds"
    lines = [
        "",
        f"## Privacy ({title})",
        "",
        f"- {'Per-example' if example else 'Per-update'} clip {privacy['clip']}, "
        f"δ = {privacy['delta']}, "
        + (
            f"target ε {privacy['target_epsilon']} ({calibrated})"
            if privacy["target_epsilon"] is not None
            else f"noise multiplier {privacy['noise_multiplier']} (no target ε)"
        )
        + f"; accountant: {privacy['accountant']}",
        f"- ε protects {privacy['protects']}",
        f"- neighbouring relation: {privacy.get('relation') or 'not recorded'}",
        "",
        "| site | ε at the exported round | ε over the run |",
        "|---|---|---|",
    ]
    for site, spent in privacy["sites"].items():
        lines.append(f"| {site} | {spent['epsilon_exported']:.3f} | {spent['epsilon_run']:.3f} |")
    return lines


def _exported(card: dict[str, Any]) -> str:
    selected = card.get("selected")
    if selected:
        text = selected_text(selected)
        return f"mean of the weights of {text}" if len(selected) > 1 else text
    if card.get("averaged_rounds"):
        return f"mean of the weights of rounds {card['averaged_rounds']}"
    return f"round {card.get('selected_round', card['rounds'])}"


def _stopped_line(card: dict[str, Any]) -> list[str]:
    stopped = card.get("stopped")
    if not stopped:
        return []
    return [f"- Stopped early after round {stopped['round']} of {card['rounds']}: "
            f"{stopped['reason']}"]  # fmt: skip


def _calibration_line(card: dict[str, Any]) -> list[str]:
    """Which labels have a calibration map (score → probability) and what it was fitted on."""
    entries = card.get("calibration")
    if not entries:
        return []
    parts = [
        f"{e['label']}: {e['method']}, {e['fitted_on']} (n {e['n']}, {len(e['x'])} knots)"
        if e.get("method")
        else f"{e['label']}: none ({e.get('note')})"
        for e in entries
    ]
    return [f"- Calibration (score → probability): {'; '.join(parts)}"]


def _after_warmup(card: dict[str, Any]) -> str:
    return ", after warm-up" if card.get("warmup_rounds") else ""


def _data_lines(cards: list[dict[str, Any]]) -> list[str]:
    """One line per site's data card: split sizes and training prevalence."""
    lines = []
    for c in cards:
        sizes = ", ".join(f"{k} {v['n']}" for k, v in c["splits"].items())
        prevalence = [_fmt(p) for p in c["splits"]["train"]["prevalence"]]
        lines.append(f"- {c['site']}: {sizes}; train prevalence {prevalence}; {c['source']}")
    return [*lines, ""] if lines else []


def _fmt(value: float | None) -> str:
    return "undefined" if value is None else f"{value:.3f}"


EXAMPLE_ACCOUNTANT = "dp-accounting RDP, Poisson sampling, add/remove one example"
SITE_ACCOUNTANT = (
    "dp-accounting RDP, one Gaussian mechanism per update a site sent, q = 1 (the coordinator's "
    "sample of sites is seeded, so not secret: no amplification), replace one site's data "
    "(sensitivity 2C: multiplier σ/2 per block)"
)
EXAMPLE_UNIT = "one training example (image row) of a site; a patient with k images: about k·ε"
SITE_UNIT = (
    "one site's whole dataset (all its patients together) against any other dataset in its "
    "place (replace-one: which sites replied is public), not a single patient beyond that; "
    "with few sites, the noise a small ε needs is large against the mean of the sites' updates"
)


@dataclass(frozen=True)
class PrivacySettings:
    """A run's DP as the card describes it: mode (``example`` / ``update``), clip C, σ (None:
    calibrated), target ε, δ, whether an accountant ran, the neighbouring relation."""

    mode: str
    clip: float
    noise_multiplier: float | None
    target_epsilon: float | None
    delta: float
    accounted: bool
    relation: str | None


@dataclass(frozen=True)
class CardSettings:
    """What the model card says about how a run trained: plain values the run takes from its
    experiment config once (``run.lifecycle.card_settings``)."""

    algorithm: str
    loss: str
    seed: int
    rounds: int
    warmup_rounds: int
    select: str | None
    image_size: int
    tta: str
    site_files: bool  # sites from site files (or registered over Flower): each its own data
    sites: int
    data: str
    privacy: PrivacySettings | None


def privacy_card(
    settings: PrivacySettings | None, site_rounds: pd.DataFrame, selected_round: int
) -> dict[str, Any] | None:
    """What the card says about DP: the mode, what ε protects, and every site's ε (from its
    own accountant, as the store has it) at the exported round and over the whole run, which
    is what the coordinator saw. Update-level clipping without noise has no ε."""
    if settings is None:
        return None
    update = settings.mode == "update"
    if not settings.accounted:
        return {"mode": "update", "clip": settings.clip, "noise_multiplier": 0.0,
                "epsilon": None}  # fmt: skip
    spent = site_rounds.dropna(subset=["dp_epsilon"])
    by_site = {}
    for site, rows in spent.groupby("site"):
        upto = rows[rows["round"] <= selected_round]
        by_site[site] = {
            "epsilon_run": float(rows["dp_epsilon"].max()),
            "epsilon_exported": float(upto["dp_epsilon"].max()) if len(upto) else 0.0,
        }
    return {
        "mode": settings.mode,
        "clip": settings.clip,
        "noise_multiplier": settings.noise_multiplier,
        "target_epsilon": settings.target_epsilon,
        "delta": settings.delta,
        "accountant": SITE_ACCOUNTANT if update else EXAMPLE_ACCOUNTANT,
        "relation": settings.relation,
        "protects": SITE_UNIT if update else EXAMPLE_UNIT,
        "sites": by_site,
    }


def model_card(
    summary: dict[str, Any],
    selected: pd.Series,
    site_frame: pd.DataFrame,
    config: CardSettings,
    hyperparameters: dict[str, Any],
    model_config: dict[str, Any],
    cards: list[dict[str, Any]],
) -> dict[str, Any]:
    """The card of the exported model: the selected round's metrics (its ``rounds`` row and
    ``site_rounds`` rows in the store) and the data cards of the sites it was trained on."""
    site_rows = [
        {
            "site": r.site,
            "n": as_int(r.n),
            "positives": json.loads(r.positives) if isinstance(r.positives, str) else None,
            "n_test": as_int(r.n_test),
            "auc": as_float(r.auc),
            "auc_lo": as_float(r.auc_lo),
            "auc_hi": as_float(r.auc_hi),
        }
        for r in site_frame.itertuples()
    ]
    synthetic = all(card.get("source") == "synthetic" for card in cards)
    names = ", ".join(card["site"] for card in cards)
    if config.site_files:
        description = (
            f"{len(cards)} sites ({names}), each with its own data and splits as its site file "
            f"defines them, images at {config.image_size} px (seed {config.seed})."
        )
    elif synthetic:
        description = (
            f"Synthetic chest-X-ray-like federation of {config.sites} sites "
            f"({config.image_size} px, seed {config.seed}), generated by "
            "fed_auc.data.synthetic; no patient data."
        )
    else:
        description = (
            f"{config.data}, partition {cards[0]['details'].get('partition')} into {len(cards)} "
            f"sites (seed {config.seed}; manifest {PARTITION_FILE} in the run folder), "
            f"images resized to {config.image_size} px."
        )
    return {
        "run_id": summary["run_id"],
        "algorithm": config.algorithm,
        "loss": config.loss,
        "seed": config.seed,
        "rounds": config.rounds,
        "warmup_rounds": config.warmup_rounds,
        "selection": config.select,
        "selected_round": int(selected["round"]),
        "model_config": model_config,
        "image_size": config.image_size,
        "tta": config.tta,
        "label_names": cards[0]["label_names"],
        # the class every AUC, sensitivity and threshold of this card is about
        "positive_class": federation_positive_class(cards),
        "hyperparameters": hyperparameters,
        "global_auc": as_float(selected["global_auc"]),
        "global_val_auc": as_float(selected["global_val_auc"]),
        "initial_auc": summary["global_auc"][0],
        "worst_site_auc": as_float(selected["worst_site_auc"]),
        "sites": site_rows,
        "data_description": description,
        "data_cards": cards,
        "intended_use": (
            "Demonstration and testing of federated AUC maximization. Not for clinical use."
        ),
        "limitations": [
            "Trained on synthetic images: says nothing about performance on real X-rays."
            if synthetic
            else "Sites defined by site files hold what their hospitals gave them."
            if config.site_files
            else "Sites are simulated by a partitioner; real hospitals differ in more ways.",
            "AUC confidence intervals are Hanley–McNeil approximations on small test splits.",
            "The exported round was chosen by validation AUC; its test AUC is still unbiased "
            "only if the test split played no part in any choice.",
        ],
    }
