"""A run's training and close, whatever the transport, as the run frame (``fed_auc.run.frame``)
drives them: ``train`` the missing rounds (the selected model tracked, its thresholds chosen,
its scores at every site), then ``close_run`` (export, model card, summary, status).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fed_auc.coordinator.loop import Coordinator
from fed_auc.coordinator.selection import BestModel, Stage, track_best_model
from fed_auc.coordinator.stopping import EarlyStop
from fed_auc.exchange import Transport
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.metrics.calibration import calibration_note, fit_calibration
from fed_auc.metrics.report import youden_threshold
from fed_auc.registry.card import (
    CardSettings,
    PrivacySettings,
    compute_card,
    model_card,
    privacy_card,
)
from fed_auc.registry.export import export_model
from fed_auc.run.headline import exported_model, exported_sites
from fed_auc.run.initial import INIT_FILE
from fed_auc.store.records import RoundRecord, as_float
from fed_auc.store.run_store import RunStore
from fed_auc.trainable import Tensors

EXPORTED = "exported"  # the store's name for the model a run exported
DEFAULT_THRESHOLD = 0.5  # where no threshold could be chosen (no pooled validation scores)


def card_settings(config: ExperimentConfig) -> CardSettings:
    """What the model card says about how the run trained, taken from its config once."""
    privacy = None
    if config.dp is not None or config.dp_clip is not None:
        update = config.update_dp()
        privacy = PrivacySettings(
            mode="update" if update is not None else "example",
            clip=config.dp_clip,
            noise_multiplier=config.dp_noise or None,
            target_epsilon=config.target_epsilon,
            delta=config.dp_delta,
            accounted=update is None or update.accounted,
            relation=config.dp_relation(),
        )
    return CardSettings(
        algorithm=config.algorithm,
        loss=config.loss,
        seed=config.seed,
        rounds=config.rounds,
        warmup_rounds=config.warmup_rounds,
        select=config.select,
        image_size=config.image_size,
        tta=config.test_time_augmentation(),
        site_files=config.site_files is not None or config.transport != "local",
        sites=config.sites,
        data=str(config.data),
        privacy=privacy,
    )


@dataclass
class Trained:
    """What training left to export: the selected model, the card's thresholds (empty: none
    could be chosen), the selected model's scores at every site (``exported_evaluation``) and
    its calibration maps per label (empty: no pooled validation scores)."""

    best: BestModel
    thresholds: list[float]
    exported: dict[str, Any]
    stopped: dict[str, Any] | None = None  # round and reason, when --early-stop ended it
    calibration: list[dict[str, Any]] = field(default_factory=list)


def train(
    config: ExperimentConfig,
    coordinator: Coordinator,
    best: BestModel,
    num_labels: int,
    on_round: Callable[[RoundRecord], None] | None = None,
    thresholds: bool = True,
) -> Trained:
    """Train the rounds still missing (fewer when ``--early-stop`` ends them), settle the
    selected model among every model the run made (``best``: its warm-up's rounds are
    already offered), choose its thresholds and score it at every site; the coordinator is
    closed after. ``thresholds``: whether pooled validation scores may leave the sites to set
    the card's operating threshold (always in-process; over Flower only with pooled
    scoring)."""
    store, run_id = coordinator.store, coordinator.run_id
    stage = Stage("main", run_id, config.algorithm, config.loss)
    track_best_model(coordinator, best, stage)
    rule = EarlyStop(config.early_stop or 0)
    try:
        coordinator.run(config.rounds, on_round, lambda: rule.reason(best))
        best.settle(store, run_id, coordinator, stage)
        chosen, calibration = [], []
        if thresholds:
            chosen, calibration = operating_thresholds(
                coordinator.transport, coordinator.sites, best.tensors
            )
        cut = chosen or [DEFAULT_THRESHOLD] * num_labels
        exported = exported_evaluation(coordinator.transport, coordinator.sites, best.tensors, cut)
    finally:
        coordinator.close()
    return Trained(best, chosen, exported, coordinator.stopped, calibration)


def close_run(
    store: RunStore,
    run_id: str,
    run_dir: Path,
    config: ExperimentConfig,
    coordinator: Coordinator,
    trained: Trained,
    model_config: dict[str, Any],
    cards: list[dict[str, Any]],
) -> dict[str, Any]:
    """Export the selected model with its card, record the run as completed, close the store;
    the export's scores per site are recorded in the store.

    Shared by ``fed-auc simulate`` and the Flower coordinator, so both export the same thing.
    """
    best, thresholds, exported = trained.best, trained.thresholds, trained.exported
    summary = summarize(run_id, run_dir, config, store)
    summary["selected_round"] = best.round
    summary["selected"] = best.selected  # stage, run, round and validation AUC of each
    summary["stopped"] = trained.stopped
    latest = best.latest["stage"]  # the run whose rows hold the selected round
    source = latest["run_id"] or run_id  # a best_model.pt kept before stages were recorded
    selected = store.rounds(source).set_index("round", drop=False).loc[best.round].copy()
    site_frame = store.site_rounds(source).query(f"round == {best.round}").copy()
    what = f"the model of {exported_model(summary)}"
    if best.metrics is not None:  # an average: its own scores replace the round's
        what = f"the {exported_model(summary)}"  # "the mean of rounds [5, 6, 7]"
        summary["averaged_rounds"] = best.rounds
        for key in ("global_auc", "global_val_auc", "worst_site_auc"):
            selected[key] = best.metrics[key]
        for key in ("auc", "auc_lo", "auc_hi", "n_test"):
            values = {site: m[key] for site, m in best.metrics["sites"].items()}
            site_frame[key] = site_frame["site"].map(values)
    settings = card_settings(config)
    card = model_card(
        summary,
        selected,
        site_frame,
        settings,
        coordinator.backend.hyperparameters(),
        model_config,
        cards,
    )
    card["threshold"] = thresholds
    # per label, fitted where the threshold was chosen; [] where no validation score was pooled
    names = card["label_names"]
    fits = trained.calibration
    card["calibration"] = [{"label": n, **c} for n, c in zip(names, fits, strict=bool(fits))]
    card["secure_aggregation"] = bool(config.secure_aggregation)
    card["averaged_rounds"] = best.rounds if best.averaged else None
    card["selected"] = best.selected
    card["stopped"] = trained.stopped
    card["privacy"] = privacy_card(settings.privacy, store.site_rounds(source), best.round)
    card["compute"] = compute_card(store.site_rounds(run_id))
    init = run_dir / INIT_FILE
    card["init"] = json.loads(init.read_text()) if init.is_file() else None
    summary["exported_auc"] = card["global_auc"]
    summary["exported_sites"] = exported_sites(card["sites"])  # its worst site: the headline's
    summary["positive_class"] = card["positive_class"]
    summary["threshold"] = thresholds
    store.record_model_evaluation(run_id, EXPORTED, "test", exported["sites"])
    for site, message in exported["failures"].items():
        store.add_event(run_id, f"exported model not scored: {message}", "warning", site)
    model_path = export_model(run_dir / "model", best.tensors, model_config, card)
    summary["model_path"] = str(model_path)
    store.add_event(run_id, f"exported {what}")
    store.add_event(run_id, "run completed")
    store.finish_run(run_id, "completed", summary)
    store.close()
    return summary


def exported_evaluation(
    transport: Transport, sites: list[str], tensors: Tensors, thresholds: list[float]
) -> dict[str, Any]:
    """The exported model scored on every site's test split: per label n, positives, AUC with
    CI, the card's threshold and binned score counts (no per-image score leaves a site).
    Sites that do not answer are listed under ``failures`` with the reason."""
    answers = transport.evaluate(sites, tensors, pooled=False, thresholds=thresholds)
    out: dict[str, Any] = {"sites": {}, "failures": {}}
    for site, answer in answers.items():
        if not hasattr(answer, "splits"):
            out["failures"][site] = f"{answer.status}: {answer.message}"
            continue
        test = answer.splits["test"]
        out["sites"][site] = [
            {
                "n": a.n,
                "positives": a.positives,
                "auc": a.auc,
                "auc_lo": a.lo,
                "auc_hi": a.hi,
                "note": a.reason,
                "threshold": t,
                "bins": b,
            }  # fmt: skip
            for a, t, b in zip(
                test.aucs, thresholds, test.bins or [None] * len(thresholds), strict=True
            )  # fmt: skip
        ]
    return out


def operating_thresholds(
    transport: Transport, sites: list[str], tensors: Tensors
) -> tuple[list[float], list[dict[str, Any]]]:
    """Per label, the score threshold maximising Youden's J on the pooled validation scores
    (0.5 where validation has one class): the model card's operating point; and, from the same
    scores, its isotonic calibration map (``fed_auc.metrics.calibration``; where validation
    has one class, ``method`` None and a ``note`` why). Both empty: nothing pooled."""
    answers = transport.evaluate(sites, tensors, pooled=True)
    pooled = {
        site: a.splits["val"]
        for site, a in answers.items()
        if hasattr(a, "splits") and a.splits["val"].scores is not None and a.splits["val"].n > 0
    }
    if not pooled:
        return [], []
    labels = np.concatenate([p.labels for p in pooled.values()])
    scores = np.concatenate([p.scores for p in pooled.values()])
    names = sorted(pooled)
    thresholds, calibration = [], []
    for j in range(labels.shape[1]):
        thresholds.append(youden_threshold(labels[:, j], scores[:, j]))
        fit = fit_calibration(labels[:, j], scores[:, j], names)
        calibration.append(fit or {"method": None, "note": calibration_note(labels[:, j])})
    return thresholds, calibration


def summarize(
    run_id: str, run_dir: Path, config: ExperimentConfig, store: RunStore
) -> dict[str, Any]:
    """The run's JSON summary, read back from the store (so a resumed run reports all rounds)."""
    rounds = store.rounds(run_id)
    last = int(rounds["round"].max()) if len(rounds) else config.rounds  # early stop: fewer
    final = store.site_rounds(run_id).query(f"round == {last}")
    return {
        "run_id": run_id,
        "run_dir": str(run_dir),
        "algorithm": config.algorithm,
        "rounds": config.rounds,
        "global_auc": [as_float(v) for v in rounds["global_auc"]],  # index = round; 0 = initial
        "worst_site_auc": [as_float(v) for v in rounds["worst_site_auc"]],
        "site_auc": {row.site: as_float(row.auc) for row in final.itertuples()},
        "site_personal_auc": {row.site: as_float(row.personal_auc) for row in final.itertuples()},
        "trained_groups": {
            row.site: json.loads(row.trained_groups)
            if isinstance(row.trained_groups, str)
            else None
            for row in final.itertuples()
        },
    }
