"""Why a federation cannot go on."""

from __future__ import annotations


class FederationError(RuntimeError):
    """The federation cannot go on (e.g. no valid reply in a round)."""


class BudgetsSpent(FederationError):
    """Every site asked in a round has spent its DP budget: training ends there."""
