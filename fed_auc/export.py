"""Export a trained global model in the registry format: ``model.pt`` plus a model card.

``model.pt`` holds only tensors, strings and numbers (loadable with ``weights_only=True``):
the network weights, the AUC variables a, b, α, and the architecture config needed to
rebuild the network. The card says what the model was trained on, how, and how well it did
per site.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fed_auc.data.labels import positive_class_text
from fed_auc.io import save_json, save_text, save_torch
from fed_auc.trainable import AUC, BUFFER, WEIGHT, Tensors

MODEL_FORMAT = "fed-auc-model/1"


def export_model(
    out_dir: str | Path,
    tensors: Tensors,
    model_config: dict[str, Any],
    card: dict[str, Any],
) -> Path:
    """Write ``model.pt``, ``model_card.json`` and ``MODEL_CARD.md``; returns ``model.pt``."""
    out_dir = Path(out_dir)
    state_dict = {
        name[len(prefix) :]: t
        for name, t in tensors.items()
        for prefix in (WEIGHT, BUFFER)
        if name.startswith(prefix)
    }
    auc = {name[len(AUC) :]: t for name, t in tensors.items() if name.startswith(AUC)}
    path = out_dir / "model.pt"
    save_torch(
        {
            "format": MODEL_FORMAT,
            "model_config": model_config,
            "state_dict": state_dict,
            "auc": auc,
            "label_names": card["label_names"],
        },
        path,
    )
    save_json(card, out_dir / "model_card.json")
    save_text(render_card(card), out_dir / "MODEL_CARD.md")
    return path


def render_card(card: dict[str, Any]) -> str:
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
    lines += _privacy_lines(card.get("privacy"))
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
    if card.get("averaged_rounds"):
        return f"mean of the weights of rounds {card['averaged_rounds']}"
    return f"round {card.get('selected_round', card['rounds'])}"


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
