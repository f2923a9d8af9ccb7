"""Which global model a run exports (``--select``): one round's, or the mean of several.

- ``best_val``: the round with the best pooled validation AUC; ``last``: the final round.
- ``best_val:K``: the mean of the weights of the K rounds with the best validation AUC.
- ``last:K``: the mean of the weights of the last K rounds.

Why averages: with a few hundred images the global model's test AUC moves by ±0.02 from
one round to the next, and a 78-image validation split cannot tell those rounds apart
reliably; the mean of several late iterates is flatter (the CODA+ stage output is itself an
average of iterates, CODASCA paper). An averaged model was never evaluated during training,
so after the last round every site scores it once and its card reports those numbers.

The candidates are every model the run made: its warm-up's rounds (fedavg + cross-entropy),
round 0 when it is ``--init``'s weights, and the run's own rounds. An AUC phase that only
lowers validation AUC then exports the warm-up's model instead of a worse one, and the card
says which stage, algorithm and loss trained what it exports (``BestModel.selected``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fed_auc.coordinator.scores import pooled_auc
from fed_auc.exchange import Evaluation
from fed_auc.io import load_state, save_json, save_state
from fed_auc.metrics.auc import mean_auc
from fed_auc.store.records import RoundRecord
from fed_auc.store.run_store import RunStore

BEST_MODEL_FILE = "best_model.pt"
HISTORY_FILE = "validation_history.json"  # every candidate's validation AUC: early stopping
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
    """Element-wise mean of same-named floating tensors; others from the last dict. A tensor
    that some of the models lack is left out: a warm-up's model has no AUC variables a, b, α,
    so a mean over warm-up and AUC rounds has none either (they do not score an image)."""
    out = {}
    for name, last in tensor_dicts[-1].items():
        if any(name not in t for t in tensor_dicts):
            continue
        out[name] = last
        if last.is_floating_point():
            out[name] = torch.stack([t[name] for t in tensor_dicts]).mean(0).to(last.dtype)
    return out


@dataclass(frozen=True)
class Stage:
    """Which part of a run made a candidate model: ``main`` (the run's own rounds),
    ``warm-up`` (its fedavg + cross-entropy rounds, recorded as their own run) or
    ``initial`` (the ``--init`` weights, round 0). ``run_id``: the store's run whose rows
    hold the candidate's round."""

    name: str
    run_id: str
    algorithm: str
    loss: str

    def describe(self) -> dict[str, str]:
        return {"stage": self.name, "run_id": self.run_id, "algorithm": self.algorithm,
                "loss": self.loss}  # fmt: skip


STAGE_ORDER = {"initial": 0, "warm-up": 1, "main": 2}  # the order a run makes them in


class BestModel:
    """The global model(s) to export, chosen from every model the run made: its warm-up's
    rounds, its ``--init`` weights (round 0) and its own rounds, each offered before it is
    recorded. A run whose AUC phase never beats its warm-up on validation thus exports the
    warm-up's model, and says so (``selected``).

    Kept on disk so that a resumed run still knows what came before the crash: the kept
    tensors in ``best_model.pt`` (every mode but plain ``last``) and every candidate's
    validation AUC in ``validation_history.json`` (what ``--early-stop`` counts).
    """

    def __init__(self, run_dir: Path, select: str, initial_candidate: bool = False) -> None:
        """``initial_candidate``: round 0 is a trained model (``--init``), not random
        weights, so it competes; otherwise round 0 stands in only until a round is trained."""
        self.path = run_dir / BEST_MODEL_FILE
        self.mode, self.count = parse_select(select)
        self.initial_candidate = initial_candidate
        self.persist = (self.mode, self.count) != ("last", 1)
        saved = load_state(self.path) if self.path.exists() else {}
        if "tensors" in saved:  # a run started before averaging existed kept one round
            saved = {"kept": [saved]}
        self.kept: list[dict[str, Any]] = [_with_stage(e) for e in saved.get("kept", [])]
        # (stage, round, validation score) of every candidate offered, in the run's order
        self.history_path = run_dir / HISTORY_FILE
        saved_history = self.history_path.exists() and json.loads(self.history_path.read_text())
        history = saved_history["history"] if saved_history else []
        self.history: list[tuple[str, int, float | None]] = [tuple(h) for h in history]
        self.metrics: dict[str, Any] | None = None  # scores of an averaged model

    @property
    def rounds(self) -> list[int]:
        return [entry["round"] for entry in sorted(self.kept, key=_order)]

    @property
    def round(self) -> int | None:
        """The exported round; for an average, the latest round in it."""
        return self.rounds[-1] if self.kept else None

    @property
    def latest(self) -> dict[str, Any] | None:
        """The latest kept entry: its stage and run hold the card's round."""
        return max(self.kept, key=_order) if self.kept else None

    @property
    def selected(self) -> list[dict[str, Any]]:
        """Each kept model: its stage, the run and round that made it, its validation AUC."""
        return [
            {**e["stage"], "round": e["round"], "val_auc": e["score"]}
            for e in sorted(self.kept, key=_order)
        ]

    @property
    def averaged(self) -> bool:
        return len(self.kept) > 1

    @property
    def tensors(self) -> dict[str, torch.Tensor] | None:
        if not self.kept:
            return None
        return average([entry["tensors"] for entry in sorted(self.kept, key=_order)])

    def offer(self, record: RoundRecord, tensors: dict[str, torch.Tensor], stage: Stage) -> None:
        score = _val_score(record)
        entry = {"stage": stage.describe(), "round": record.round, "score": score,
                 "tensors": tensors}  # fmt: skip
        trained = [e for e in self.kept if not e.get("standing_in")]
        if record.round == 0 and not (self.initial_candidate and not self.history):
            # random weights, or a warm-up's end offered again as the main run's round 0:
            # only until a trained model exists
            if trained:
                return
            entry["standing_in"] = True
            self.kept = [entry]
        else:
            if record.round == 0:
                entry["stage"] = {**entry["stage"], "stage": "initial"}
            # a resume may offer a recorded round again: the new entry replaces it
            key = _order(entry)
            self.history = [h for h in self.history if _order_of(h[0], h[1]) != key]
            self.history.append((entry["stage"]["stage"], record.round, score))
            self.kept = self._choose([*(e for e in trained if _order(e) != key), entry])
        if any(e is entry for e in self.kept):  # copied and saved only when kept
            entry["tensors"] = _clone(tensors)
            if self.persist:
                save_state({"kept": self.kept}, self.path)
        save_json({"history": self.history}, self.history_path)

    def evaluations_without_gain(self) -> int:
        """How many validated main-run rounds came after the best validated model of the
        whole run (warm-up and ``--init`` included): what early stopping counts."""
        scored = [h for h in self.history if h[2] is not None]
        if not scored:
            return 0
        best = max(range(len(scored)), key=lambda i: (scored[i][2], -i))  # ties: earlier
        return sum(1 for h in scored[best + 1 :] if h[0] == "main")

    def best_validated(self) -> tuple[str, int, float] | None:
        """(stage, round, pooled validation AUC) of the best validated model so far."""
        scored = [h for h in self.history if h[2] is not None]
        if not scored:
            return None
        return max(scored, key=lambda h: h[2])  # ties: the earlier

    def _choose(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The ``count`` entries to keep: the latest, or the best validated (ties: earlier)."""
        entries = sorted(entries, key=_order)
        if self.mode == "last":
            return entries[-self.count :]
        scored = [e for e in entries if e["score"] is not None]
        if not scored:  # no validation yet: the latest round stands in
            return entries[-1:]
        return sorted(scored, key=lambda e: -e["score"])[: self.count]

    def settle(self, store: RunStore, run_id: str, coordinator: Any, stage: Stage) -> None:
        """After the last round: with ``last`` and every round done before a resume, nothing
        was offered in this process, so take the final state; an averaged model is scored by
        every site now (while the transport is open), as a round's model was."""
        if not self.kept:
            last = RoundRecord(round=int(store.rounds(run_id)["round"].max()))
            self.offer(last, coordinator.backend.global_tensors(coordinator.state), stage)
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


def _order_of(stage: str, round_: int) -> tuple[int, int]:
    return STAGE_ORDER[stage], round_


def _order(entry: dict[str, Any]) -> tuple[int, int]:
    """Where an entry comes in the run: initial, warm-up rounds, then the run's rounds."""
    return _order_of(entry["stage"]["stage"], entry["round"])


def _with_stage(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry saved before stages were recorded: one of the run's own rounds."""
    if "stage" not in entry:
        entry = {**entry, "stage": {"stage": "main", "run_id": "", "algorithm": "",
                                    "loss": ""}}  # fmt: skip
    return entry


def _clone(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in tensors.items()}


def track_best_model(coordinator: Any, best: BestModel, stage: Stage) -> BestModel:
    """``best``, offered every round's global model of ``coordinator`` (made in ``stage``)
    before the round is recorded."""
    coordinator.before_commit = lambda record: best.offer(
        record, coordinator.backend.global_tensors(coordinator.state), stage
    )
    return best
