"""A federated run from its first round to its exported model, whatever the transport.

``fed-auc simulate`` (in-process nodes) and the Flower coordinator (``fed_auc.transport.flower``)
both use these: the optional fedavg + cross-entropy warm-up, the training rounds with the
selected model tracked, and closing the run (export, model card, summary, status).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from fed_auc.algorithms import build_backend
from fed_auc.coordinator import Coordinator
from fed_auc.data.labels import federation_positive_class
from fed_auc.evaluate import youden_threshold
from fed_auc.experiment import ExperimentConfig
from fed_auc.export import export_model
from fed_auc.losses import build_loss
from fed_auc.models import DenseNetClassifier, group_of, model_from_config
from fed_auc.robust import Aggregation
from fed_auc.selection import BestModel, track_best_model
from fed_auc.store import RoundRecord, RunStore
from fed_auc.trainable import BUFFER, WEIGHT, Tensors, Trainable

PARTITION_FILE = "partition.json"
EXPORTED = "exported"  # the store's name for the model a run exported
DEFAULT_THRESHOLD = 0.5  # where no threshold could be chosen (no pooled validation scores)


def git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def warm_start(
    config: ExperimentConfig,
    model: DenseNetClassifier,
    store: RunStore,
    run_id: str,
    run_dir: Path,
    transport_for: Callable[[str, Any], Any],
    pooled_scoring: bool = True,
    personal: Collection[str] = (),
    record: dict[str, Any] | None = None,
) -> Tensors:
    """``warmup_rounds`` rounds of fedavg + cross-entropy on the same sites, from the main
    run's initial network; the weights it ends with (``w/``, ``buf/``) start the main run.
    Recorded in the store as its own fedavg run, named in the main run's events.
    ``transport_for(warm_run_id, hyperparameters)`` reaches the same sites' nodes for that
    run (fedavg with these hyperparameters, cross-entropy). ``personal``: tensors the nodes
    keep (personal heads), as in the main run."""
    options = {**config.to_dict(), "algorithm": "fedavg", "loss": "ce", "backend_options": {}}
    hyperparameters = ExperimentConfig(**options).backend_hyperparameters()
    backend = build_backend("fedavg", **hyperparameters)
    warm_model = model_from_config(model.config())
    warm_model.load_state_dict(model.state_dict())
    num_labels = model.num_labels
    server = Trainable(warm_model, build_loss("ce", num_labels, [0.5] * num_labels))
    recorded = {**options, **(record or {}), "warmup_for": run_id}  # record: data_record
    warm_id = store.create_run("fedavg", recorded, git_revision())
    coordinator = Coordinator(
        backend,
        transport_for(warm_id, hyperparameters),
        store,
        warm_id,
        run_dir / "warmup",
        server,
        participation=config.participation,
        seed=config.seed,
        pooled_scoring=pooled_scoring,
        personal=personal,
        secure=secure_aggregation(config),  # the warm-up's replies are as private
    )
    try:
        coordinator.run(config.warmup_rounds)
    finally:
        coordinator.close()
    store.finish_run(warm_id, "completed", {"warmup_for": run_id})
    store.add_event(run_id, f"warm start: {config.warmup_rounds} fedavg+CE rounds, run {warm_id}")
    tensors = backend.global_tensors(coordinator.state)
    warm = {k: v for k, v in tensors.items() if k.startswith((WEIGHT, BUFFER))}
    if config.warmup_head == "reset":
        return reset_classifier(warm, model)
    if config.warmup_head == "recenter":
        return recenter_classifier(warm, coordinator.pos_ratio)
    return warm


def reset_classifier(tensors: Tensors, model: DenseNetClassifier) -> Tensors:
    """``tensors`` with the classifier (output layer) set back to ``model``'s initial values.

    LibAUC's two-stage recipe drops the cross-entropy head before its AUC phase: a head fitted
    to CE saturates the sigmoid scores that the AUC-margin loss then has to move."""
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = dict(tensors)
    for name in tensors:
        key = name.split("/", 1)[1]
        if group_of(key) == "classifier":
            out[name] = initial[key]
    return out


def recenter_classifier(tensors: Tensors, pos_ratio: list[float]) -> Tensors:
    """``tensors`` with each label's output bias moved by −logit(p_l), p_l its prevalence.

    A classifier fitted with cross-entropy to p = 5 % positives scores most images near p,
    where the sigmoid's slope h(1 − h) ≈ 0.05 scales the AUC-margin loss's gradient down;
    the shift puts a calibrated model's mean score near ½ (slope ≈ ¼) and leaves every
    image's rank, hence every AUC, unchanged. Needs only the registered counts (p)."""
    shift = torch.logit(torch.tensor(pos_ratio, dtype=torch.float64))
    out = dict(tensors)
    biases = [n for n in tensors if n.startswith(WEIGHT) and n.endswith("bias")
              and group_of(n.split("/", 1)[1]) == "classifier"]  # fmt: skip
    if len(biases) != 1 or out[biases[0]].shape != shift.shape:
        raise ValueError(f"expected one classifier bias of shape {tuple(shift.shape)}, "
                         f"found {biases}")  # fmt: skip
    bias = out[biases[0]]
    out[biases[0]] = bias - shift.to(bias.dtype)
    return out


def secure_aggregation(config: ExperimentConfig):
    """The run's ``SecureAggregation`` settings, or None when it is off."""
    if not config.secure_aggregation:
        return None
    from fed_auc.secure_aggregation.rounds import SecureAggregation

    return SecureAggregation(
        config.secure_aggregation_threshold, config.secure_aggregation_neighbours
    )


def start_coordinator(
    config: ExperimentConfig,
    transport: Any,
    store: RunStore,
    run_id: str,
    run_dir: Path,
    server: Trainable,
    personal: Collection[str],
    fixed_steps: dict[str, int],
    pooled_scoring: bool = True,
) -> Coordinator:
    """The coordinator of the main run, the same for both transports; ``fixed_steps``: the
    τ_i that sites set in their own files."""
    return Coordinator(
        build_backend(config.algorithm, **config.backend_hyperparameters()),
        transport,
        store,
        run_id,
        run_dir,
        server,
        participation=config.participation,
        seed=config.seed,
        pooled_scoring=pooled_scoring,
        local_work=config.local_work(list(transport.register()), fixed_steps),
        personal=personal,
        max_update_norm=config.max_update_norm,
        aggregation=Aggregation.parse(config.aggregation),
        secure=secure_aggregation(config),
        eval_every=config.eval_every,
        dp_relation=config.dp_relation(),
    )


def train_and_close(
    config: ExperimentConfig,
    coordinator: Coordinator,
    run_dir: Path,
    model_config: dict[str, Any],
    cards: list[dict[str, Any]],
    on_round: Callable[[RoundRecord], None] | None = None,
    thresholds: bool = True,
) -> dict[str, Any]:
    """Train the rounds still missing, export the selected model and close the run.
    ``thresholds``: whether pooled validation scores may leave the sites to set the card's
    operating threshold (always in-process; over Flower only with pooled scoring)."""
    store, run_id = coordinator.store, coordinator.run_id
    best = track_best_model(coordinator, run_dir, config.select)
    try:
        coordinator.run(config.rounds, on_round)
        best.settle(store, run_id, coordinator)
        chosen = []
        if thresholds:
            chosen = operating_thresholds(coordinator.transport, coordinator.sites, best.tensors)
        cut = chosen or [DEFAULT_THRESHOLD] * int(model_config["num_labels"])
        exported = exported_evaluation(coordinator.transport, coordinator.sites, best.tensors, cut)
    except BaseException as exc:
        fail_run(store, run_id, exc)
        raise
    finally:
        coordinator.close()
    return close_run(store, run_id, run_dir, config, coordinator.backend, best, model_config,
                     cards, chosen, exported)  # fmt: skip


def close_run(
    store: RunStore,
    run_id: str,
    run_dir: Path,
    config: ExperimentConfig,
    backend: Any,
    best: BestModel,
    model_config: dict[str, Any],
    cards: list[dict[str, Any]],
    thresholds: list[float],
    exported: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Export the selected model with its card, record the run as completed, close the store.
    ``exported``: the export's scores per site (``exported_evaluation``), recorded in the store.

    Shared by ``fed-auc simulate`` and the Flower coordinator, so both export the same thing.
    """
    summary = summarize(run_id, run_dir, config, store)
    summary["selected_round"] = best.round
    selected = store.rounds(run_id).set_index("round", drop=False).loc[best.round].copy()
    site_frame = store.site_rounds(run_id).query(f"round == {best.round}").copy()
    what = f"the model of round {best.round}"
    if best.metrics is not None:  # an average: its own scores replace the round's
        what = f"the mean of the models of rounds {best.rounds}"
        summary["averaged_rounds"] = best.rounds
        for key in ("global_auc", "global_val_auc", "worst_site_auc"):
            selected[key] = best.metrics[key]
        for key in ("auc", "auc_lo", "auc_hi", "n_test"):
            values = {site: m[key] for site, m in best.metrics["sites"].items()}
            site_frame[key] = site_frame["site"].map(values)
    card = model_card(
        summary, selected, site_frame, config, backend.hyperparameters(), model_config, cards
    )
    card["threshold"] = thresholds
    card["averaged_rounds"] = best.rounds if best.averaged else None
    card["privacy"] = privacy_card(config, store.site_rounds(run_id), best.round)
    summary["exported_auc"] = card["global_auc"]
    summary["threshold"] = thresholds
    if exported is not None:
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
    transport, sites: list[str], tensors: Tensors, thresholds: list[float]
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


def operating_thresholds(transport, sites: list[str], tensors) -> list[float]:
    """Per label, the score threshold maximising Youden's J on the pooled validation scores
    (0.5 where validation has one class): the model card's operating point."""
    answers = transport.evaluate(sites, tensors, pooled=True)
    parts = [a.splits["val"] for a in answers.values() if hasattr(a, "splits")]
    parts = [p for p in parts if p.scores is not None and p.n > 0]
    if not parts:
        return []
    labels = np.concatenate([p.labels for p in parts])
    scores = np.concatenate([p.scores for p in parts])
    return [youden_threshold(labels[:, j], scores[:, j]) for j in range(labels.shape[1])]


def fail_run(store: RunStore, run_id: str, exc: BaseException) -> None:
    """Mark the run failed (rounds already recorded stay) and close the store."""
    if isinstance(exc, KeyboardInterrupt):  # Ctrl-C, or SIGTERM where the CLI maps it so
        reason = "stopped by the operator (Ctrl-C or SIGTERM)"
        store.add_event(run_id, f"run {reason}; it can be resumed", level="error")
    else:
        reason = str(exc)
        store.add_event(run_id, f"run failed: {type(exc).__name__}: {exc}", level="error")
    store.finish_run(run_id, "failed", {"error": reason})
    store.close()


def summarize(
    run_id: str, run_dir: Path, config: ExperimentConfig, store: RunStore
) -> dict[str, Any]:
    """The run's JSON summary, read back from the store (so a resumed run reports all rounds)."""
    rounds = store.rounds(run_id)
    final = store.site_rounds(run_id).query(f"round == {config.rounds}")
    return {
        "run_id": run_id,
        "run_dir": str(run_dir),
        "algorithm": config.algorithm,
        "rounds": config.rounds,
        "global_auc": [_number(v) for v in rounds["global_auc"]],  # index = round; 0 = initial
        "worst_site_auc": [_number(v) for v in rounds["worst_site_auc"]],
        "site_auc": {row.site: _number(row.auc) for row in final.itertuples()},
        "site_personal_auc": {row.site: _number(row.personal_auc) for row in final.itertuples()},
        "trained_groups": {
            row.site: json.loads(row.trained_groups)
            if isinstance(row.trained_groups, str)
            else None
            for row in final.itertuples()
        },
    }


def _number(value: Any) -> float | None:
    return None if value is None or value != value else float(value)


def _integer(value: Any) -> int | None:
    return None if value is None or value != value else int(value)


EXAMPLE_ACCOUNTANT = "dp-accounting RDP, Poisson sampling, add/remove one example"
SITE_ACCOUNTANT = (
    "dp-accounting RDP, one Gaussian mechanism per update a site sent, q = 1 (the coordinator's "
    "sample of sites is seeded, so not secret: no amplification), replace one site's data "
    "(sensitivity 2C: multiplier σ/2 per block)"
)
EXAMPLE_UNIT = "one training example (image row) of a site; a patient with k images: about k·ε"
SITE_UNIT = (
    "one site's whole dataset (all its patients together) against any other dataset in its "
    "place (replace-one: which sites replied is public), not a single patient beyond that; "
    "with few sites, the noise a small ε needs is large against the mean of the sites' updates"
)


def privacy_card(
    config: ExperimentConfig, site_rounds: pd.DataFrame, selected_round: int
) -> dict[str, Any] | None:
    """What the card says about DP: the mode, what ε protects, and every site's ε (from its
    own accountant, as the store has it) at the exported round and over the whole run, which
    is what the coordinator saw. Update-level clipping without noise has no ε."""
    if config.dp is None and config.dp_clip is None:
        return None
    update = config.update_dp()
    if update is not None and not update.accounted:
        return {"mode": "update", "clip": config.dp_clip, "noise_multiplier": 0.0,
                "epsilon": None}  # fmt: skip
    spent = site_rounds.dropna(subset=["dp_epsilon"])
    by_site = {}
    for site, rows in spent.groupby("site"):
        upto = rows[rows["round"] <= selected_round]
        by_site[site] = {
            "epsilon_run": float(rows["dp_epsilon"].max()),
            "epsilon_exported": float(upto["dp_epsilon"].max()) if len(upto) else 0.0,
        }
    return {
        "mode": "update" if update is not None else "example",
        "clip": config.dp_clip,
        "noise_multiplier": config.dp_noise or None,
        "target_epsilon": config.target_epsilon,
        "delta": config.dp_delta,
        "accountant": SITE_ACCOUNTANT if update is not None else EXAMPLE_ACCOUNTANT,
        "relation": config.dp_relation(),
        "protects": SITE_UNIT if update is not None else EXAMPLE_UNIT,
        "sites": by_site,
    }


def model_card(
    summary: dict[str, Any],
    selected: pd.Series,
    site_frame: pd.DataFrame,
    config: ExperimentConfig,
    hyperparameters: dict[str, Any],
    model_config: dict[str, Any],
    cards: list[dict[str, Any]],
) -> dict[str, Any]:
    """The card of the exported model: the selected round's metrics (its ``rounds`` row and
    ``site_rounds`` rows in the store) and the data cards of the sites it was trained on."""
    site_rows = [
        {
            "site": r.site,
            "n": _integer(r.n),
            "positives": json.loads(r.positives) if isinstance(r.positives, str) else None,
            "n_test": _integer(r.n_test),
            "auc": _number(r.auc),
            "auc_lo": _number(r.auc_lo),
            "auc_hi": _number(r.auc_hi),
        }
        for r in site_frame.itertuples()
    ]
    synthetic = all(card.get("source") == "synthetic" for card in cards)
    names = ", ".join(card["site"] for card in cards)
    if config.site_files is not None or config.transport != "local":
        description = (
            f"{len(cards)} sites ({names}), each with its own data and splits as its site file "
            f"defines them, images at {config.image_size} px (seed {config.seed})."
        )
    elif synthetic:
        description = (
            f"Synthetic chest-X-ray-like federation of {config.sites} sites "
            f"({config.image_size} px, seed {config.seed}), generated by "
            "fed_auc.data.synthetic; no patient data."
        )
    else:
        description = (
            f"{config.data}, partition {cards[0]['details'].get('partition')} into {len(cards)} "
            f"sites (seed {config.seed}; manifest {PARTITION_FILE} in the run folder), "
            f"images resized to {config.image_size} px."
        )
    return {
        "run_id": summary["run_id"],
        "algorithm": config.algorithm,
        "loss": config.loss,
        "seed": config.seed,
        "rounds": config.rounds,
        "warmup_rounds": config.warmup_rounds,
        "selection": config.select,
        "selected_round": int(selected["round"]),
        "model_config": model_config,
        "image_size": config.image_size,
        "tta": config.test_time_augmentation(),
        "label_names": cards[0]["label_names"],
        # the class every AUC, sensitivity and threshold of this card is about
        "positive_class": federation_positive_class(cards),
        "hyperparameters": hyperparameters,
        "global_auc": _number(selected["global_auc"]),
        "global_val_auc": _number(selected["global_val_auc"]),
        "initial_auc": summary["global_auc"][0],
        "worst_site_auc": _number(selected["worst_site_auc"]),
        "sites": site_rows,
        "data_description": description,
        "data_cards": cards,
        "intended_use": (
            "Demonstration and testing of federated AUC maximization. Not for clinical use."
        ),
        "limitations": [
            "Trained on synthetic images: says nothing about performance on real X-rays."
            if synthetic
            else "Sites defined by site files hold what their hospitals gave them."
            if config.site_files is not None or config.transport != "local"
            else "Sites are simulated by a partitioner; real hospitals differ in more ways.",
            "AUC confidence intervals are Hanley–McNeil approximations on small test splits.",
            "The exported round was chosen by validation AUC; its test AUC is still unbiased "
            "only if the test split played no part in any choice.",
        ],
    }
