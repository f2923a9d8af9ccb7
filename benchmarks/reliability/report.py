"""RELIABILITY.md: the AUC cost of client-side DP, the tables of every fault and bad input,
and the command that runs them all (``python -m benchmarks.reliability``)."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common.fragment import command_line, emit
from benchmarks.common.machine import describe
from benchmarks.reliability import __doc__ as OVERVIEW
from benchmarks.reliability.bad_inputs import bad_inputs
from benchmarks.reliability.faults import (
    HOSTILE,
    SMALL,
    crash_and_resume,
    flaky_nodes,
    hostile_replies,
)
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.simulation import run_simulation

DP_ROUNDS = 15
QUICK_ROUNDS = 3  # --quick: rounds of SMALL and of the DP runs


def dp_cost(workdir: Path, rounds: int = DP_ROUNDS) -> list[dict]:
    rows = []
    base = {"sites": 4, "rounds": rounds, "local_steps": 8, "seed": 0, "select": "last"}
    for clip, noise in [(None, 0.0), (1.0, 0.0), (1.0, 0.01), (1.0, 0.05)]:
        config = ExperimentConfig(
            runs_dir=str(workdir / f"dp{clip}-{noise}"), dp_clip=clip, dp_noise=noise, **base
        )
        summary = run_simulation(config)
        rows.append(
            {
                "clip": clip,
                "noise": noise,
                "auc": summary["global_auc"][-1],
                "worst": summary["worst_site_auc"][-1],
            }
        )
    return rows


def render(
    crash: dict, flaky: dict, hostile: dict, bad: dict, dp: list[dict], small: dict, dp_rounds: int
) -> str:
    """The tables (no title): RELIABILITY.md below its heading, and the ``--markdown`` fragment."""
    bad_tried = sum(t for t, _ in bad.values())
    bad_clear = sum(c for _, c in bad.values())
    lines = [
        f"Produced by `{command_line()}` ({describe()}; {time.strftime('%Y-%m-%d')}). "
        f"Federation: synthetic, {small['sites']} sites, {small['rounds']} rounds, "
        f"I = {small['local_steps']}, seed {small['seed']}, data_scale {small['data_scale']}, "
        "tiny DenseNet; kill times and flaky failures drawn with seeds 0 and 1.",
        "",
        "| fault injected | count | runs completed | rounds lost (target 0) | result |",
        "|---|---|---|---|---|",
        f"| SIGKILL of the whole run at a random moment, then `--resume` | {crash['injected']} "
        f"| {crash['completed']} / {crash['injected']} | {crash['lost']} "
        f"(duplicated: {crash['duplicated']}) | final model vs uninterrupted run: "
        f"max abs diff {crash['max_diff']:.2e} |",
        f"| node fails or stays silent (p = 0.5 per request) | {flaky['faults']} in "
        f"{flaky['runs']} runs | {flaky['completed']} / {flaky['runs']} | {flaky['lost']} | "
        "recorded as error, round completes with the other sites |",
        f"| hostile replies ({hostile['kinds']} kinds × every round) | {hostile['tried']} | "
        f"{hostile['runs_completed']} / {hostile['kinds']} | {hostile['lost']} | "
        f"**{hostile['averaged']} averaged in** (target 0); {hostile['events']} rejection "
        "events |",
        "",
        "Hostile kinds (CODASCA unless named): "
        + ", ".join(HOSTILE)
        + " (norm bound `--max-update-norm 1000`: ‖v_k − v‖ of iterates, the step the server "
        "takes for a normalized direction or a full gradient).",
        "",
        "| bad input kind | tried | clear error (names file / field / value) |",
        "|---|---|---|",
        *[f"| {kind} | {tried} | {clear} |" for kind, (tried, clear) in bad.items()],
        f"| **all** | **{bad_tried}** | **{bad_clear}** (target all) |",
        "",
        f"**Client-side DP: AUC cost.** Synthetic demo federation (4 sites, {dp_rounds} rounds, "
        "I = 8, seed 0, CODASCA, last round exported); each block of every update clipped to C, "
        "then N(0, (σC)²) noise per coordinate (`--dp-clip C --dp-noise σ`).",
        "",
        "| clip C | noise σ | pooled test AUC | worst-site AUC |",
        "|---|---|---|---|",
        *[f"| {r['clip'] or '—'} | {r['noise']} | {r['auc']:.3f} | {r['worst']:.3f} |" for r in dp],
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.reliability",
        description=OVERVIEW,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="1 kill, 1 flaky run, 3 rounds")
    parser.add_argument("--kills", type=int, help="(full: 5, quick: 1)")
    parser.add_argument("--flaky-runs", type=int, help="(full: 2, quick: 1)")
    parser.add_argument(
        "--out",
        type=Path,
        help="a whole report (default: RELIABILITY.md; none with --quick or --markdown)",
    )
    parser.add_argument("--markdown", type=Path, help="write the tables to this file")
    args = parser.parse_args()
    kills = args.kills or (1 if args.quick else 5)
    flaky_runs = args.flaky_runs or (1 if args.quick else 2)
    small = {**SMALL, "rounds": QUICK_ROUNDS} if args.quick else SMALL
    dp_rounds = QUICK_ROUNDS if args.quick else DP_ROUNDS
    # With --markdown, run_all.py splices the fragment into RELIABILITY.md between its markers.
    out = args.out or (None if args.quick or args.markdown else Path("RELIABILITY.md"))
    np.random.seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        crash = crash_and_resume(kills, work, small)
        flaky = flaky_nodes(flaky_runs, work, small)
        hostile = hostile_replies(work, small)
        bad = bad_inputs(work)
        dp = dp_cost(work, dp_rounds)
    text = render(crash, flaky, hostile, bad, dp, small, dp_rounds)
    if out is not None:
        out.write_text("# Reliability\n\n" + text)
    emit(text, args.markdown)
