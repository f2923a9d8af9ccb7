"""A run store filled for the dashboard tests: known numbers the pages must show.

Runs (all with real ROC points from seeded labels and scores):
- ``complete``: codasca, 2 trained rounds, 4 sites; ``east`` has no test positives (AUC
  undefined), ``south`` is dropped in round 2 (not scored there either), ``north`` trains a
  partial model in round 2, ``west`` is rejected in round 1. It exported round 1 with the
  card's threshold ``THRESHOLD`` and stored the export's binned test-score counts.
- ``other``: fedavg, 2 rounds, other byte counts (for Compare).
- ``one``: a single trained round.
- ``failed``: round 0, then failed with an error message.
- ``live``: still running, only round 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fed_auc.metrics.operating_point import default_edges, score_bins
from fed_auc.metrics.roc import roc_points
from fed_auc.store.records import RoundRecord, SiteRound
from fed_auc.store.run_store import RunStore

SITES = ("east", "north", "south", "west")
TEST_N = 60
THRESHOLD = 0.363
EXPORTED_ROUND = 1


def split_of(site: str, round_: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded labels and scores of a site's test split; east has no positives."""
    rng = np.random.default_rng(SITES.index(site) * 100 + round_)
    labels = (rng.random(TEST_N) < (0.0 if site == "east" else 0.3)).astype(float)
    scores = np.clip(0.25 + 0.08 * round_ * labels + rng.normal(0, 0.2, TEST_N), 0, 1)
    return labels, scores


def _site_row(site: str, round_: int, status: str) -> SiteRound:
    if status == "dropped":  # no answer: neither trained nor scored
        return SiteRound(site, status, n=100, positives=[30])
    labels, scores = split_of(site, round_)
    roc = roc_points(labels, scores)
    positives = int(labels.sum())
    row = SiteRound(site, status, n=100, positives=[30], n_test=TEST_N, test_positives=[positives])
    if roc["fpr"]:
        row.auc = float(np.trapezoid(roc["tpr"], roc["fpr"]))
        row.auc_lo, row.auc_hi = row.auc - 0.1, min(1.0, row.auc + 0.1)
        row.metrics = {"roc": [roc], "undefined": []}
    else:
        row.metrics = {"roc": [roc], "undefined": ["AUC undefined: no positives"]}
    if status == "completed":
        row.steps = 4 + SITES.index(site)
        row.drift, row.cosine, row.update_norm = 0.1 * round_, 0.9 - 0.1 * round_, 1.0
        row.bytes_down, row.bytes_up = 1000, 800
    return row


def _round(round_: int, statuses: dict[str, str], scale: int = 1) -> RoundRecord:
    rows = [_site_row(site, round_, statuses.get(site, "completed")) for site in SITES]
    defined = [r.auc for r in rows if r.auc is not None]
    record = RoundRecord(
        round=round_,
        global_auc=0.55 + 0.1 * round_,
        worst_site_auc=min(defined),
        mean_site_auc=float(np.mean(defined)),
        bytes_down=3_000_000 * scale * (round_ > 0),
        bytes_up=2_000_000 * scale * (round_ > 0),
        sites=rows,
    )
    if statuses.get("south") == "dropped":
        record.events.append(("south", "error", "train: dropped: no answer in time"))
    if statuses.get("west") == "rejected":
        record.events.append(("west", "error", "train: rejected: w/conv has NaN"))
    return record


def exported() -> dict[str, list[dict]]:
    """The export (round 1's model) scored at every site: counts, AUC, threshold, bins."""
    out = {}
    for site in SITES:
        labels, scores = split_of(site, EXPORTED_ROUND)
        row = _site_row(site, EXPORTED_ROUND, "completed")
        bins = score_bins(labels, scores, default_edges([THRESHOLD]))
        out[site] = [
            {
                "n": TEST_N,
                "positives": int(labels.sum()),
                "auc": row.auc,
                "auc_lo": row.auc_lo,
                "auc_hi": row.auc_hi,
                "note": "; ".join(row.metrics["undefined"]),
                "threshold": THRESHOLD,
                "bins": bins.to_dict(),
            }  # fmt: skip
        ]
    return out


def card(site: str, intensity: bool = True) -> dict:
    index = SITES.index(site)
    split = {"n": 100, "positives": [10 + 5 * index]}
    if intensity:
        split |= {"intensity_mean": 0.3 + 0.05 * index, "intensity_std": 0.2 - 0.01 * index}
    return {"label_names": ["finding"], "positive_class": ["finding present"], "site": site,
            "train": split, "source": "synthetic"}  # fmt: skip


def fill(runs_dir: Path) -> dict[str, str]:
    """Write the four runs; returns their ids by name."""
    ids = {}
    with RunStore(runs_dir) as store:
        ids["other"] = store.create_run("fedavg", {"rounds": 2}, run_id="run-other")
        store.record_sites(ids["other"], {s: card(s, intensity=False) for s in SITES})
        for round_ in range(3):
            store.record_round(ids["other"], _round(round_, {}, scale=2))
        store.finish_run(ids["other"], "completed", {})

        ids["complete"] = store.create_run(
            "codasca", {"rounds": 2, "transport": "flower"}, run_id="run-complete"
        )
        store.record_sites(ids["complete"], {s: card(s) for s in SITES})
        store.record_round(ids["complete"], _round(0, dict.fromkeys(SITES, "initial")))
        store.record_round(ids["complete"], _round(1, {"west": "rejected"}))
        last = _round(2, {"south": "dropped"})
        last.sites[SITES.index("north")].trained_groups = ["dense3", "head"]
        store.record_round(ids["complete"], last)
        store.add_event(ids["complete"], "run completed")
        store.record_model_evaluation(ids["complete"], "exported", "test", exported())
        summary = {"selected_round": EXPORTED_ROUND, "threshold": [THRESHOLD]}
        store.finish_run(ids["complete"], "completed", summary | {"exported_auc": 0.61})

        ids["one"] = store.create_run("codasca", {"rounds": 1}, run_id="run-one")
        store.record_sites(ids["one"], {s: card(s) for s in SITES})
        store.record_round(ids["one"], _round(0, dict.fromkeys(SITES, "initial")))
        store.record_round(ids["one"], _round(1, {}))
        store.finish_run(ids["one"], "completed", {})

        ids["failed"] = store.create_run("coda_plus", {"rounds": 5}, run_id="run-failed")
        store.record_round(ids["failed"], _round(0, dict.fromkeys(SITES, "initial")))
        store.finish_run(ids["failed"], "failed", {"error": "round 1: no valid reply"})

        ids["live"] = store.create_run("codasca", {"rounds": 9}, run_id="run-live")
        store.record_round(ids["live"], _round(0, dict.fromkeys(SITES, "initial")))
    return ids


def fill_sized(runs_dir: Path, n_sites: int, rounds: int = 3) -> str:
    """A run of ``n_sites`` sites (site_00 …) with varying local steps and data cards (each
    split's intensity), for readability at any federation size; returns its id."""
    names = [f"site_{i:02d}" for i in range(n_sites)]
    rng = np.random.default_rng(n_sites)
    with RunStore(runs_dir) as store:
        run_id = store.create_run("codasca", {"rounds": rounds}, run_id=f"run-{n_sites}-sites")
        store.record_sites(
            run_id,
            {
                name: {
                    "label_names": ["finding"],
                    "source": "synthetic",
                    "train": {
                        "n": 100,
                        "positives": [int(rng.integers(5, 50))],
                        "intensity_mean": float(rng.random()),
                        "intensity_std": float(rng.random()),
                    },  # fmt: skip
                    **{
                        split: {"n": 30, "intensity_mean": float(rng.random()),
                                "intensity_std": float(rng.random())}
                        for split in ("val", "test")
                    },  # every split's intensity, as a real card has: the widest table
                }
                for name in names
            },
        )
        for round_ in range(rounds + 1):
            rows = []
            for i, name in enumerate(names):
                status = "initial" if round_ == 0 else "completed"
                row = SiteRound(name, status, n=100, positives=[30], n_test=TEST_N,
                                test_positives=[20], auc=0.6 + 0.01 * i, auc_lo=0.5,
                                auc_hi=0.7)  # fmt: skip
                if round_:
                    row.steps = 4 + (i + round_) % 3
                rows.append(row)
            store.record_round(run_id, RoundRecord(round_, global_auc=0.7, sites=rows))
        store.finish_run(run_id, "completed", {})
    return run_id


def fill_evaluation_job(runs_dir: Path, model_run_id: str, held_out: tuple[str, ...] = ()) -> str:
    """An evaluation job (its own ``evaluate`` run, id made as the CLI makes it) that scored
    the model ``model_run_id`` exported at every site of ``SITES``; returns the job's run id."""
    from fed_auc.evaluate.job import combine, record_job
    from fed_auc.exchange import EvaluationRequest
    from fed_auc.metrics.report import label_result

    request = EvaluationRequest("fed-auc-model/1", {}, ["finding"], [THRESHOLD], "none",
                                ["test"], 200, 0)  # fmt: skip
    answers = {}
    for site in SITES:
        labels, scores = split_of(site, EXPORTED_ROUND)
        result = label_result(labels, scores, THRESHOLD, 200, 0)
        answers[site] = {"site": site, "splits": {"test": {"finding": result}}}
    result = combine(answers, request, "test", held_out=list(held_out))
    model_card = {"run_id": model_run_id, "label_names": ["finding"],
                  "positive_class": ["finding present"]}  # fmt: skip
    with RunStore(runs_dir) as store:
        job = store.create_run("evaluate", {"transport": "flower", "evaluation": {}})
        store.record_sites(job, {s: card(s) for s in SITES})
        summary = record_job(store, job, {"test": result}, f"runs/{model_run_id}/model",
                             model_card, "flower")  # fmt: skip
        store.finish_run(job, "completed", summary)
    return job


def fill_warmup(runs_dir: Path, warm_rounds: int = 10, rounds: int = 60) -> tuple[str, str]:
    """A main run of ``rounds`` planned rounds warm-started by a fedavg run of
    ``warm_rounds`` rounds, recorded as ``fed_auc.run.warmup.warm_start`` records it (its own run,
    config ``warmup_for``, the main run's config otherwise, no data cards of its own; the main
    run records its cards after the warm-up);
    returns (warm-up id, main id)."""
    config = {"rounds": rounds, "warmup_rounds": warm_rounds, "transport": "local"}
    with RunStore(runs_dir) as store:
        main = store.create_run("codasca", config, run_id="run-main")
        warm = store.create_run(
            "fedavg", {**config, "loss": "ce", "warmup_for": main}, run_id="run-warmup"
        )
        for round_ in range(warm_rounds + 1):
            statuses = dict.fromkeys(SITES, "initial" if round_ == 0 else "completed")
            record = _round(round_, statuses)
            record.global_auc = 0.5 + 0.01 * round_  # an AUC, whatever the round
            store.record_round(warm, record)
        store.finish_run(warm, "completed", {"warmup_for": main})
        store.add_event(main, f"warm start: {warm_rounds} fedavg+CE rounds, run {warm}")
        store.record_sites(main, {s: card(s) for s in SITES})  # after the warm-up, as there
        for round_ in range(3):
            statuses = dict.fromkeys(SITES, "initial" if round_ == 0 else "completed")
            store.record_round(main, _round(round_, statuses))
    return warm, main
