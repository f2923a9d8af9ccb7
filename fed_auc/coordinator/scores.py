"""A round's scores: what every site's evaluation of the global model puts in the store.

Kept apart from the round loop (``fed_auc.coordinator.loop``) so that model selection
(``fed_auc.coordinator.selection``) pools scores the same way without the coordinator.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fed_auc.exchange import Evaluation, NodeFailure
from fed_auc.metrics.auc import mean_auc, per_label_auc
from fed_auc.store.records import RoundRecord, SiteRound


def record_scores(
    answers: Mapping[str, Evaluation | NodeFailure],
    record: RoundRecord,
    rows: Mapping[str, SiteRound],
) -> list[float | None]:
    """Each site's AUC with CI, counts and ROC into its row; worst, mean and pooled AUC into
    the round; a site that could not answer as an event. Returns the pooled per-label AUC."""
    evaluations: dict[str, Evaluation] = {}
    for site, answer in answers.items():
        if isinstance(answer, NodeFailure):
            record.events.append((site, "warning", f"evaluation {answer.status}: {answer.message}"))
            continue
        evaluations[site] = answer
        row, test, val = rows[site], answer.splits["test"], answer.splits["val"]
        site_auc = mean_auc(test.aucs)
        first = test.aucs[0]
        row.auc = site_auc
        if len(test.aucs) == 1:
            row.auc_lo, row.auc_hi = first.lo, first.hi
        row.val_auc = mean_auc(val.aucs)
        row.n_test, row.test_positives = test.n, test.positives
        row.metrics["test_auc_per_label"] = [a.auc for a in test.aucs]
        row.metrics["undefined"] = [a.reason for a in test.aucs if a.reason]
        row.metrics["roc"] = test.roc
        if answer.personal is not None:
            personal = answer.personal["test"].aucs
            row.personal_auc = mean_auc(personal)
            if len(personal) == 1:
                row.personal_auc_lo, row.personal_auc_hi = personal[0].lo, personal[0].hi
    site_aucs = {s: rows[s].auc for s in evaluations}
    defined = [a for a in site_aucs.values() if a is not None]
    record.worst_site_auc = min(defined) if defined else None
    record.mean_site_auc = float(np.mean(defined)) if defined else None
    record.global_auc, per_label = pooled_auc(evaluations, "test")
    record.global_val_auc, _ = pooled_auc(evaluations, "val")
    return per_label


def pooled_auc(
    evaluations: Mapping[str, Evaluation], split: str
) -> tuple[float | None, list[float | None]]:
    """Mean and per-label AUC of a split over every site's scores pooled (None when scores
    do not leave the sites)."""
    parts = [e.splits[split] for e in evaluations.values() if e.splits[split].n > 0]
    if not parts or parts[0].scores is None:
        return None, []
    labels = np.concatenate([p.labels for p in parts])
    scores = np.concatenate([p.scores for p in parts])
    aucs = per_label_auc(labels, scores)
    return mean_auc(aucs), [a.auc for a in aucs]
