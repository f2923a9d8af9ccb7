"""Early stopping (``--early-stop N``): end a run's rounds once pooled validation AUC has not
improved for N evaluations.

The best so far is the best model of the whole run, its warm-up and ``--init`` weights
included (``fed_auc.coordinator.selection.BestModel``): an AUC phase that never beats the
warm-up it started from stops after N evaluations instead of spending its remaining rounds
moving away from it; the export then takes the warm-up's model. Read from the validation
history ``BestModel`` keeps on disk, so a resumed run counts the evaluations before the crash.
"""

from __future__ import annotations

from dataclasses import dataclass

from fed_auc.coordinator.selection import BestModel


@dataclass(frozen=True)
class EarlyStop:
    """``patience``: evaluations without a gain that end the run (0: never)."""

    patience: int

    def reason(self, best: BestModel) -> str | None:
        """Why the run stops now, in words, or None while it goes on."""
        stale = best.evaluations_without_gain()
        if not self.patience or stale < self.patience:
            return None
        stage, round_, score = best.best_validated()
        where = {"main": f"round {round_}", "warm-up": f"warm-up round {round_}",
                 "initial": "the --init model (round 0)"}[stage]  # fmt: skip
        return (
            f"pooled validation AUC has not improved for {stale} evaluations on "
            f"{score:.4f} at {where} (--early-stop {self.patience})"
        )
