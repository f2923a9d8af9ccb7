"""How a person reads an AUC on a console: the value, its interval with the method that made
it, and the positive class it is about, in one phrase.

Every console line that shows an AUC (``fed-auc simulate``/``demo``, ``coordinator``, ``node``,
``evaluate``, ``runs``, leave-each-out) is built with ``auc_text``, so a copied line or a
cropped screenshot still says which class the number is for and how its interval was made.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

HANLEY_MCNEIL = "Hanley–McNeil"  # every round's per-site interval (fed_auc.metrics.auc)
BOOTSTRAP = "bootstrap"  # fed-auc evaluate: percentile bootstrap of the scores
BINNED_BOOTSTRAP = "bootstrap of binned counts"  # pooled from the sites' score counts
UNRECORDED = "not recorded"


def class_text(positive_class: str | Sequence[str] | None) -> str:
    """``malignant``, ``Cardiomegaly, Edema`` (one per label), or ``not recorded``."""
    if positive_class is None or len(positive_class) == 0:
        return UNRECORDED
    if isinstance(positive_class, str):
        return positive_class
    return ", ".join(positive_class)


def auc_text(
    auc: float | None,
    lo: float | None = None,
    hi: float | None = None,
    method: str | None = None,
    positive_class: str | Sequence[str] | None = None,
    undefined: str = "undefined",
) -> str:
    """``AUC 0.871 [0.802, 0.940] (bootstrap), positive class malignant``.

    The interval shows where both ends are known, with ``method``. ``positive_class`` None
    leaves the class out (a line that names it once for several AUCs; ``class_text(None)``
    says it was not recorded). ``undefined``: the text for a missing AUC.
    """
    text = f"AUC {undefined}" if auc is None else f"AUC {auc:.3f}"
    if auc is not None and lo is not None and hi is not None:
        text += f" [{lo:.3f}, {hi:.3f}]" + (f" ({method})" if method else "")
    if positive_class is not None:
        text += f", positive class {class_text(positive_class)}"
    return text


def interval_text(lo: float | None, hi: float | None, missing: str = "—") -> str:
    """``0.750–0.965``: a 95 % interval at the precision of its AUC (3 decimals), or
    ``missing`` where an end is unknown (a table cell, a dashboard caption)."""
    if lo is None or hi is None or lo != lo or hi != hi:
        return missing
    return f"{lo:.3f}–{hi:.3f}"


STAGE_WORDS = {"initial": "the --init model", "warm-up": "warm-up", "main": ""}


def selected_text(selected: list[dict[str, Any]]) -> str:
    """The exported model's rounds and which stage trained them: ``round 12``, ``warm-up
    round 7 (fedavg + ce)``, ``warm-up rounds [9, 10] (fedavg + ce) and rounds [3, 4]``."""
    parts = []
    for stage in ("initial", "warm-up", "main"):
        of = [e for e in selected if e["stage"] == stage]
        if not of:
            continue
        if stage == "initial":
            parts.append("round 0 (the --init model)")
            continue
        rounds = [e["round"] for e in of]
        word = f"round {rounds[0]}" if len(rounds) == 1 else f"rounds {rounds}"
        trained = f" ({of[0]['algorithm']} + {of[0]['loss']})" if stage == "warm-up" else ""
        parts.append(f"{STAGE_WORDS[stage]} {word}{trained}".strip())
    return " and ".join(parts)
