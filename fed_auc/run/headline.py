"""One headline number per run: the exported model's pooled test AUC (what its model card
shows), with the last round's beside it and named as such.

``fed-auc simulate``/``demo``, ``fed-auc runs`` and the dashboard all print this, so a run is
never reported with one AUC on the terminal and another on its card (DESIGN.md, Dashboard:
"the headline is the exported model, not the last round").
"""

from __future__ import annotations

from typing import Any

from fed_auc.store.records import as_float


def exported_model(summary: dict[str, Any]) -> str | None:
    """What the run exported, in words: ``round 7`` or ``mean of rounds [5, 6, 7]``."""
    averaged = summary.get("averaged_rounds")
    if averaged:
        return f"mean of rounds {list(averaged)}"
    selected = summary.get("selected_round")
    return None if selected is None else f"round {int(selected)}"


def headline(
    summary: dict[str, Any] | None, last_round: int | None, last_auc: float | None
) -> dict[str, Any]:
    """The run's headline as plain values: ``auc`` is the exported model's when the run
    exported one, else the last round's; ``auc_of`` says which."""
    summary = summary or {}
    exported = as_float(summary.get("exported_auc"))
    model = exported_model(summary)
    out: dict[str, Any] = {
        "auc": exported,
        "auc_of": f"exported model ({model})" if model else "exported model",
        "exported_auc": exported,
        "exported_round": summary.get("selected_round"),
        "averaged_rounds": summary.get("averaged_rounds"),
        "last_round": last_round,
        "last_round_auc": as_float(last_auc),
    }
    if "exported_auc" not in summary:  # running, failed, or no export
        out["auc"], out["auc_of"] = out["last_round_auc"], "last round"
    return out


def headline_text(head: dict[str, Any]) -> str:
    """``exported model (round 7) AUC 0.885; last round (60) 0.889``."""
    last = "n/a" if head["last_round_auc"] is None else f"{head['last_round_auc']:.3f}"
    where = "" if head["last_round"] is None else f" ({head['last_round']})"
    if head["auc_of"] == "last round":
        return f"last round{where} AUC {last} (no exported model)"
    auc = "n/a" if head["auc"] is None else f"{head['auc']:.3f}"
    return f"{head['auc_of']} AUC {auc}; last round{where} {last}"


def summary_headline(summary: dict[str, Any]) -> str:
    """The headline of a finished run's JSON summary (``run_simulation``'s, the coordinator's)."""
    aucs = summary.get("global_auc") or []
    last = len(aucs) - 1 if aucs else None
    return headline_text(headline(summary, last, aucs[-1] if aucs else None))
