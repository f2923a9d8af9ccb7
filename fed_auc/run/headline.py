"""One headline per run: the exported model's pooled test AUC (what its model card shows) and
its worst site, with the last round's pooled AUC beside them and named as such, and the
positive class every number is about.

``fed-auc simulate``/``demo``, ``fed-auc coordinator`` and ``fed-auc runs`` all print this, so a
run is never reported with one AUC on the terminal and another on its card (DESIGN.md,
Dashboard: "the headline is the exported model, not the last round"), nor with the worst site
of the last round beside the exported model's AUC.
"""

from __future__ import annotations

from typing import Any

from fed_auc.metrics.wording import HANLEY_MCNEIL, auc_text, class_text, selected_text
from fed_auc.store.records import as_float


def exported_model(summary: dict[str, Any]) -> str | None:
    """What the run exported, in words: ``round 7``, ``mean of rounds [5, 6, 7]`` or, when
    its warm-up (or ``--init``) made it, ``warm-up round 9 (fedavg + ce)``."""
    selected = summary.get("selected")
    if selected:
        text = selected_text(selected)
        return f"mean of {text}" if len(selected) > 1 else text
    averaged = summary.get("averaged_rounds")
    if averaged:
        return f"mean of rounds {list(averaged)}"
    selected = summary.get("selected_round")
    return None if selected is None else f"round {int(selected)}"


def exported_sites(card_sites: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The exported model's test AUC per site with its interval, from its model card's rows
    (``close_run`` keeps them in the run's summary)."""
    return [
        {"site": s["site"], "auc": s["auc"], "auc_lo": s["auc_lo"], "auc_hi": s["auc_hi"]}
        for s in card_sites
    ]


def worst_site(sites: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The site where the exported model's test AUC is lowest (``exported_sites`` rows)."""
    defined = [s for s in sites or [] if as_float(s.get("auc")) is not None]
    return min(defined, key=lambda s: s["auc"]) if defined else None


def headline(
    summary: dict[str, Any] | None,
    last_round: int | None,
    last_auc: float | None,
    positive_class: list[str] | None = None,
) -> dict[str, Any]:
    """The run's headline as plain values: ``auc`` is the exported model's when the run
    exported one, else the last round's; ``auc_of`` says which. ``worst_site``: the exported
    model's lowest site AUC with its interval. ``positive_class``: the sites' (the summary's
    when not given)."""
    summary = summary or {}
    exported = as_float(summary.get("exported_auc"))
    model = exported_model(summary)
    out: dict[str, Any] = {
        "auc": exported,
        "auc_of": f"exported model ({model})" if model else "exported model",
        "exported_auc": exported,
        "exported_round": summary.get("selected_round"),
        "averaged_rounds": summary.get("averaged_rounds"),
        "worst_site": worst_site(summary.get("exported_sites")),
        "last_round": last_round,
        "last_round_auc": as_float(last_auc),
        "positive_class": positive_class or summary.get("positive_class"),
        "stopped": summary.get("stopped"),  # --early-stop ended the rounds: round, reason
    }
    if "exported_auc" not in summary:  # running, failed, or no export
        out["auc"], out["auc_of"] = out["last_round_auc"], "last round"
    return out


def headline_text(head: dict[str, Any]) -> str:
    """``exported model (round 7): pooled test AUC 0.885, positive class malignant; worst site
    south AUC 0.749 [0.600, 0.898] (Hanley–McNeil); last round (60): pooled AUC 0.889``."""
    where = "" if head["last_round"] is None else f" ({head['last_round']})"
    pooled = auc_text(head["auc"], positive_class=class_text(head["positive_class"]),
                      undefined="n/a")  # fmt: skip
    if head["auc_of"] == "last round":
        return f"last round{where}: pooled test {pooled} (no exported model)"
    text = f"{head['auc_of']}: pooled test {pooled}"
    worst = head["worst_site"]
    if worst is not None:
        interval = auc_text(worst["auc"], worst["auc_lo"], worst["auc_hi"], HANLEY_MCNEIL)
        text += f"; worst site {worst['site']} {interval}"
    text += f"; last round{where}: pooled {auc_text(head['last_round_auc'], undefined='n/a')}"
    stopped = head.get("stopped")
    if stopped:  # said with the numbers it explains
        text += f"; stopped early after round {stopped['round']}: {stopped['reason']}"
    return text


def summary_headline(summary: dict[str, Any]) -> str:
    """The headline of a finished run's JSON summary (``run_simulation``'s, the coordinator's)."""
    aucs = summary.get("global_auc") or []
    last = len(aucs) - 1 if aucs else None
    return headline_text(headline(summary, last, aucs[-1] if aucs else None))
