"""``fed-auc runs``: the runs of a run store, one line (or JSON object) each."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from fed_auc.run.headline import headline, headline_text
from fed_auc.store.records import as_float


def add_runs_parser(sub: argparse._SubParsersAction) -> None:
    runs = sub.add_parser("runs", help="list the runs in a runs directory")
    runs.add_argument("--runs-dir", default="runs")
    runs.add_argument("--json", action="store_true")


def runs_command(args: argparse.Namespace) -> int:
    list_runs(args.runs_dir, args.json)
    return 0


def list_runs(runs_dir: str, as_json: bool) -> None:
    from fed_auc.store.run_store import STORE_FILE, RunStore

    if not (Path(runs_dir) / STORE_FILE).exists():
        raise SystemExit(f"fed-auc runs: no run store in {runs_dir!r} (expected {STORE_FILE})")
    with RunStore(runs_dir) as store:
        runs = store.runs()
        rows = []
        for run in runs.itertuples():
            rounds = store.rounds(run.id).sort_values("round")
            last = int(rounds["round"].max()) if len(rounds) else 0
            last_auc = as_float(rounds["global_auc"].iloc[-1]) if len(rounds) else None
            summary = run.summary if isinstance(run.summary, dict) else None
            if isinstance(run.summary, str):
                summary = json.loads(run.summary)
            rows.append(
                {
                    "run_id": run.id,
                    "algorithm": run.algorithm,
                    "status": run.status,
                    "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started_at)),
                    "rounds": last,
                    # the headline: the exported model's AUC (its model card's), else the last
                    # round's; both named (fed_auc.run.headline)
                    **headline(summary, last if len(rounds) else None, last_auc),
                }
            )
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        print(f"no runs in {runs_dir}")
    for r in rows:
        print(
            f"{r['run_id']}  {r['algorithm']:<11} {r['status']:<10} {r['started']}  "
            f"rounds {r['rounds']:<4} {headline_text(r)}"
        )
