"""``fed-auc runs``: the runs of a run store, one line (or JSON object) each: what it ran on
(data, transport, sites), and its headline AUC with the positive class it is about."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from fed_auc.run.headline import headline, headline_text
from fed_auc.store.records import as_float

SITES_SHOWN = 4  # site names on a line; the rest counted (all of them in --json)


def add_runs_parser(sub: argparse._SubParsersAction) -> None:
    runs = sub.add_parser("runs", help="list the runs in a runs directory")
    runs.add_argument("--runs-dir", default="runs")
    runs.add_argument("--json", action="store_true")
    runs.add_argument(
        "--compare",
        nargs=2,
        metavar=("A", "B"),
        help="two runs on the same sites and split: each site's and the pooled AUC difference "
        "of their exported models on the same test images, with DeLong's paired 95 %% interval "
        "(recorded for the dashboard's Compare page)",
    )


def runs_command(args: argparse.Namespace) -> int:
    if args.compare:
        from fed_auc.cli.compare import compare_command

        compare_command(args.runs_dir, *args.compare, args.json)
        return 0
    list_runs(args.runs_dir, args.json)
    return 0


def list_runs(runs_dir: str, as_json: bool) -> None:
    from fed_auc.store.facts import run_facts
    from fed_auc.store.run_store import STORE_FILE, RunStore

    if not (Path(runs_dir) / STORE_FILE).exists():
        raise SystemExit(f"fed-auc runs: no run store in {runs_dir!r} (expected {STORE_FILE})")
    with RunStore(runs_dir) as store:
        runs = store.runs()
        jobs = store.evaluations()
        rows = []
        for run in runs.itertuples():
            rounds = store.rounds(run.id).sort_values("round")
            last = int(rounds["round"].max()) if len(rounds) else 0
            last_auc = as_float(rounds["global_auc"].iloc[-1]) if len(rounds) else None
            summary = run.summary if isinstance(run.summary, dict) else None
            if isinstance(run.summary, str):
                summary = json.loads(run.summary)
            config = json.loads(run.config) if isinstance(run.config, str) else run.config
            facts = run_facts(store, run.id, config)
            row = {
                "run_id": run.id,
                "algorithm": run.algorithm,
                "status": run.status,
                "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started_at)),
                "rounds": last,
                **facts,
                # the headline: the exported model's AUC (its model card's), else the last
                # round's; both named (fed_auc.run.headline)
                **headline(
                    summary, last if len(rounds) else None, last_auc, facts["positive_class"]
                ),  # fmt: skip
            }
            if run.algorithm == "evaluate":  # an evaluation job: its pooled result
                row["evaluation"] = _pooled(jobs[jobs["run_id"] == run.id])
                if summary and "comparison" in summary:  # two models compared at the nodes
                    pair = summary["comparison"]
                    row["compared"] = [pair["run_a"]["id"], pair["run_b"]["id"]]
            rows.append(row)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        print(f"no runs in {runs_dir}")
    for r in rows:
        print(
            f"{r['run_id']}  {r['algorithm']:<11} {r['status']:<10} {r['started']}  "
            f"rounds {r['rounds']:<4} {_facts_text(r)} · {_result_text(r)}"
        )


def _facts_text(row: dict[str, Any]) -> str:
    """``data site files · flower · 3 sites (east, north, south)``, a warm-up run's main run
    first."""
    names = row["sites"][:SITES_SHOWN] + (["…"] if len(row["sites"]) > SITES_SHOWN else [])
    listed = f" ({', '.join(names)})" if names else ""
    warm = f"warm-up of run {row['warmup_for']} · " if row["warmup_for"] else ""
    return f"{warm}data {row['data']} · {row['transport']} · {len(row['sites'])} sites{listed}"


def _result_text(row: dict[str, Any]) -> str:
    if "evaluation" not in row:
        return headline_text(row)
    if row.get("compared"):
        a, b = row["compared"]
        return f"comparison job: runs {a} (A) and {b} (B), rows in the comparisons table"
    if row["evaluation"] is None:
        return "evaluation job: nothing recorded"
    from fed_auc.evaluate.job import label_lines

    labels, model_run = row["evaluation"]
    by = f" of run {model_run}'s model" if model_run else ""
    positive = row["positive_class"] or [None] * len(labels)
    return f"evaluation job{by}: pooled test {label_lines(labels, positive)}"


def _pooled(jobs) -> tuple[dict[str, Any], str | None] | None:
    """An evaluation job's pooled test result per label and the run whose model it scored."""
    test = jobs[jobs["split"] == "test"]
    if test.empty or not isinstance(test["pooled"].iloc[0], str):
        return None
    return json.loads(test["pooled"].iloc[0]), test["model_run_id"].iloc[0]
