"""Which global model a run exports (``--select``): one round's, or the mean of several.

- ``best_val``: the round with the best pooled validation AUC; ``last``: the final round.
- ``best_val:K``: the mean of the weights of the K rounds with the best validation AUC.
- ``last:K``: the mean of the weights of the last K rounds.

Why averages: with a few hundred images the global model's test AUC moves by ±0.02 from
one round to the next, and a 78-image validation split cannot tell those rounds apart
reliably; the mean of several late iterates is flatter (the CODA+ stage output is itself an
average of iterates, CODASCA paper). An averaged model was never evaluated during training,
so after the last round every site scores it once and its card reports those numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fed_auc.coordinator.scores import pooled_auc
from fed_auc.exchange import Evaluation
from fed_auc.io import load_state, save_state
from fed_auc.metrics.auc import mean_auc
from fed_auc.store.records import RoundRecord
from fed_auc.store.run_store import RunStore

BEST_MODEL_FILE = "best_model.pt"
SELECT_MODES = ("best_val", "last")


def parse_select(text: str) -> tuple[str, int]:
    """``best_val`` / ``last``, optionally ``:K`` rounds averaged -> (mode, K)."""
    mode, colon, count = text.partition(":")
    if mode not in SELECT_MODES or (colon and not (count.isdigit() and int(count) >= 1)):
        raise ValueError(
            f"select must be one of best_val, last, best_val:K, last:K (K >= 1 rounds averaged), "
            f"got {text!r}"
        )
    return mode, int(count or 1)


def average(tensor_dicts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Element-wise mean of same-named floating tensors; others from the last dict."""
    out = dict(tensor_dicts[-1])
    for name, last in out.items():
        if last.is_floating_point():
            out[name] = torch.stack([t[name] for t in tensor_dicts]).mean(0).to(last.dtype)
    return out


class BestModel:
    """The global model(s) to export, offered every round before the round is recorded.

    Kept on disk (``best_model.pt``, every mode but plain ``last``) so that a resumed run
    still knows the rounds kept before the crash.
    """

    def __init__(self, run_dir: Path, select: str) -> None:
        self.path = run_dir / BEST_MODEL_FILE
        self.mode, self.count = parse_select(select)
        self.persist = (self.mode, self.count) != ("last", 1)
        saved = load_state(self.path) if self.path.exists() else {}
        if "tensors" in saved:  # a run started before averaging existed kept one round
            saved = {"kept": [saved]}
        self.kept: list[dict[str, Any]] = saved.get("kept", [])  # round, score, tensors
        self.metrics: dict[str, Any] | None = None  # scores of an averaged model

    @property
    def rounds(self) -> list[int]:
        return sorted(entry["round"] for entry in self.kept)

    @property
    def round(self) -> int | None:
        """The exported round; for an average, the latest round in it."""
        return self.rounds[-1] if self.kept else None

    @property
    def averaged(self) -> bool:
        return len(self.kept) > 1

    @property
    def tensors(self) -> dict[str, torch.Tensor] | None:
        if not self.kept:
            return None
        return average([entry["tensors"] for entry in sorted(self.kept, key=_round)])

    def offer(self, record: RoundRecord, tensors: dict[str, torch.Tensor]) -> None:
        score = _val_score(record)
        entry = {"round": record.round, "score": score, "tensors": tensors}
        if record.round == 0:  # the initial model: only until a trained round exists
            if self.rounds not in ([], [0]):
                return
            self.kept = [entry]
        else:  # a resume may offer a recorded round again: the new entry replaces it
            trained = [e for e in self.kept if e["round"] not in (0, record.round)]
            self.kept = self._choose([*trained, entry])
        if any(e is entry for e in self.kept):  # copied only when kept; else nothing changed
            entry["tensors"] = _clone(tensors)
            if self.persist:
                save_state({"kept": self.kept}, self.path)

    def _choose(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The ``count`` entries to keep: the latest, or the best validated (ties: earlier)."""
        entries = sorted(entries, key=_round)
        if self.mode == "last":
            return entries[-self.count :]
        scored = [e for e in entries if e["score"] is not None]
        if not scored:  # no validation yet: the latest round stands in
            return entries[-1:]
        return sorted(scored, key=lambda e: -e["score"])[: self.count]

    def settle(self, store: RunStore, run_id: str, coordinator: Any) -> None:
        """After the last round: with ``last`` and every round done before a resume, nothing
        was offered in this process, so take the final state; an averaged model is scored by
        every site now (while the transport is open), as a round's model was."""
        if not self.kept:
            last = RoundRecord(round=int(store.rounds(run_id)["round"].max()))
            self.offer(last, coordinator.backend.global_tensors(coordinator.state))
        if self.averaged:
            self.metrics = score_model(coordinator, self.tensors)


def score_model(coordinator: Any, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Pooled test and validation AUC, worst-site AUC and per-site test AUC (with CI for one
    label) of a model, computed as the coordinator computes them for a round's model."""
    answers = coordinator.transport.evaluate(
        coordinator.sites, tensors, pooled=coordinator.policy.pooled_scoring
    )
    evaluations = {s: a for s, a in answers.items() if isinstance(a, Evaluation)}
    sites = {}
    for site, answer in evaluations.items():
        test = answer.splits["test"]
        single = test.aucs[0] if len(test.aucs) == 1 else None
        sites[site] = {
            "auc": mean_auc(test.aucs),
            "auc_lo": single.lo if single else None,
            "auc_hi": single.hi if single else None,
            "n_test": test.n,
        }
    defined = [s["auc"] for s in sites.values() if s["auc"] is not None]
    return {
        "global_auc": pooled_auc(evaluations, "test")[0],
        "global_val_auc": pooled_auc(evaluations, "val")[0],
        "worst_site_auc": min(defined) if defined else None,
        "sites": sites,
    }


def _val_score(record: RoundRecord) -> float | None:
    """Pooled validation AUC, else the mean over sites of their validation AUC."""
    if record.global_val_auc is not None:
        return record.global_val_auc
    values = [s.val_auc for s in record.sites if s.val_auc is not None]
    return sum(values) / len(values) if values else None


def _round(entry: dict[str, Any]) -> int:
    return entry["round"]


def _clone(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in tensors.items()}


def track_best_model(coordinator: Any, run_dir: Path, select: str) -> BestModel:
    """A ``BestModel`` offered every round's global model before the round is recorded."""
    best = BestModel(run_dir, select)
    coordinator.before_commit = lambda record: best.offer(
        record, coordinator.backend.global_tensors(coordinator.state)
    )
    return best
