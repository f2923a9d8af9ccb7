"""BreastMNIST: federated (dirichlet:0.5, 4 sites, CODASCA) vs centralized (--sites 1).

Runs `fed-auc simulate` once per seed and row (setting × augmentation), then reports the
pooled test AUC of the exported model (`fed-auc simulate`'s default for image files: the
mean of the 5 best-validation rounds, scored with flip TTA) as mean ± sd over seeds, next
to the two quoted references, and the mean validation AUC (what a recipe should be chosen
on: the test split is the only one the references report). The defaults are the recipe of
BENCHMARKS.md: small @ 28 px, lr 0.2, batch 32, 10 warm-up + 60 CODASCA rounds, seeds 0-2
(`--seeds 0 1 2 3 4 5` for a spread that does not hang on three partitions). Every run
uses one torch thread (OMP_NUM_THREADS=1): on a shared 2-core machine two threads made the
same round 20× slower by spinning.

    python -m benchmarks.anchors.breastmnist --quick                      # tiny @ 28 px, minutes
    python -m benchmarks.anchors.breastmnist --jobs 2 --markdown benchmarks/results/breastmnist.md
    python -m benchmarks.anchors.breastmnist --model densenet121 --image-size 32 \\
        --rows federated:flip
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.common.simulate import simulate
from fed_auc.metrics.wording import selected_text

REFERENCES = [  # quoted, not run by this script
    ("MedMNIST v2 benchmark (quoted)", "ResNet-18 @ 28 px", "0.901"),
    (
        "LibAUC recipe, centralized (quoted: CE then AUC-margin + PESG, best-validation epoch)",
        "DenseNet121 @ 32 px",
        "0.909 ± 0.012",
    ),
]
# `small` over `tiny`: higher validation AUC on every one of seeds 0-5 (BENCHMARKS.md).
FULL = {"model": "small", "rounds": 60, "warmup_rounds": 10, "seeds": [0, 1, 2]}
QUICK = {"model": "tiny", "rounds": 10, "warmup_rounds": 3, "seeds": [0, 1, 2]}
DEFAULT_ROWS = ["federated:none", "federated:flip", "centralized:flip"]
QUICK_ROWS = ["federated:flip", "centralized:flip"]


@dataclass(frozen=True)
class Row:
    """One table row: the federated split or the centralized run, with one augmentation."""

    setting: str  # federated | centralized
    augment: str

    @classmethod
    def parse(cls, text: str) -> Row:
        setting, _, augment = text.partition(":")
        if setting not in ("federated", "centralized") or not augment:
            raise ValueError(f"row must be federated:AUGMENT or centralized:AUGMENT, got {text!r}")
        return cls(setting, augment)

    def simulate_args(self) -> list[str]:
        if self.setting == "federated":
            return ["--partition", "dirichlet:0.5", "--sites", "4", "--local-steps", "8"]
        # Centralized: the same images per round as 4 sites × 8 steps, one site with all data.
        return ["--sites", "1", "--local-steps", "32"]


def simulate_command(args: argparse.Namespace, row: Row, seed: int) -> list[str]:
    """The `fed-auc simulate` command of one run (printed in the Markdown as run)."""
    command = [sys.executable, "-m", "fed_auc.cli", "simulate", "--json"]
    command += ["--data", f"medmnist:{args.npz}", "--algorithm", "codasca"]
    command += ["--model", args.model, "--image-size", str(args.image_size)]
    command += ["--rounds", str(args.rounds), "--warmup-rounds", str(args.warmup_rounds)]
    command += ["--batch-size", str(args.batch_size), "--lr", str(args.lr)]
    command += ["--augment", row.augment, "--seed", str(seed)]
    command += ["--runs-dir", str(args.runs_dir), *row.simulate_args()]
    return command + shlex.split(args.simulate_args)


def run(args: argparse.Namespace, row: Row, seed: int) -> dict:
    """One simulated run: the exported model (a round, or a mean of rounds), its pooled test
    AUC, and the selection and test-time augmentation its card records."""
    summary, card = simulate(simulate_command(args, row, seed))
    return {
        "seed": seed,
        "val_auc": card["global_val_auc"],
        "selected_round": summary["selected_round"],
        "averaged_rounds": summary.get("averaged_rounds"),
        # the rounds with their stage: the whole run's (warm-up rounds too) are candidates
        "exported": selected_text(card["selected"]) if card.get("selected") else None,
        "test_auc": summary["exported_auc"],
        "selection": card["selection"],
        "tta": card["tta"],
    }


def summarize(results: list[dict], key: str = "test_auc") -> dict:
    """Mean and sample sd over seeds (sd 0 for one seed) of a result's `key`."""
    aucs = [r[key] for r in results]
    sd = statistics.stdev(aucs) if len(aucs) > 1 else 0.0
    return {"mean": statistics.mean(aucs), "sd": sd, "aucs": aucs}


def run_row(args: argparse.Namespace, row: Row) -> list[dict]:
    """Every seed of one row, `--jobs` runs at a time (each on one torch thread)."""
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        return list(pool.map(lambda seed: run(args, row, seed), args.seeds))


def machine_line() -> str:
    return (
        f"{platform.platform()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        "1 torch thread per run (OMP_NUM_THREADS=1)"
    )


def markdown(args: argparse.Namespace, table: dict[Row, list[dict]], argv: list[str]) -> str:
    """The result table as a Markdown fragment, with the command, machine and seeds."""
    model = f"{args.model} @ {args.image_size} px"
    lines = [
        "### BreastMNIST: federated vs centralized, with training-time augmentation",
        "",
        f"Command: `python -m benchmarks.anchors.breastmnist {shlex.join(argv)}`  ",
        f"Machine: {machine_line()}  ",
        f"Seeds: {', '.join(map(str, args.seeds))} (partition, initialization, sampling, "
        f"augmentation); {args.warmup_rounds} warm-up rounds (fedavg + CE), then "
        f"{args.rounds} CODASCA rounds, lr {args.lr}, batch {args.batch_size}; exported model "
        "per `--select` (a round, or the mean of the weights of the listed rounds), scored "
        "with the test-time augmentation (TTA) its card records.",
        "",
        "| setting | augment | select, TTA | model | test AUC (mean ± sd) | per seed "
        "| validation AUC (mean) | exported rounds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row, results in table.items():
        s = summarize(results)
        auc = f"{s['mean']:.3f} ± {s['sd']:.3f}"
        if len(results) == 1:
            auc = f"{s['mean']:.3f} (1 seed)"
        per_seed = ", ".join(f"{a:.3f}" for a in s["aucs"])
        val = summarize(results, "val_auc")["mean"]
        chosen = "; ".join(
            r.get("exported") or (str(r["selected_round"]) if not r["averaged_rounds"] else
                                  "+".join(map(str, r["averaged_rounds"])))
            for r in results
        )  # fmt: skip
        how = ", ".join(sorted({f"{r['selection']}, {r['tta']}" for r in results}))
        setting = (
            "federated, dirichlet:0.5, 4 sites"
            if row.setting == "federated"
            else ("centralized (`--sites 1`)")
        )
        lines.append(
            f"| {setting} | {row.augment} | {how} | {model} | **{auc}** | {per_seed} | {val:.3f} "
            f"| {chosen} |"
        )
    for name, ref_model, auc in REFERENCES:
        lines.append(f"| {name} | — | — | {ref_model} | {auc} | — | — | — |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 + 3 warm-up rounds, 2 rows")
    parser.add_argument("--markdown", type=Path, help="write the result table here (Markdown)")
    parser.add_argument("--npz", default="../shared/data/breastmnist.npz")
    parser.add_argument("--model", help="DenseNet config (default small; tiny with --quick)")
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--lr", type=float, default=0.2, help="warm-up and CODASCA step size")
    parser.add_argument("--batch-size", type=int, default=32, help="per site and local step")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--warmup-rounds", type=int)
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (one thread each)")
    parser.add_argument(
        "--rows", nargs="+", type=Row.parse, help=f"SETTING:AUGMENT (default {DEFAULT_ROWS})"
    )
    parser.add_argument("--simulate-args", default="", help="further `fed-auc simulate` flags")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/breastmnist"))
    parser.add_argument("--out", type=Path, help="write the per-seed results as JSON here")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    mode = QUICK if args.quick else FULL
    for name, value in mode.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.rows is None:
        args.rows = [Row.parse(r) for r in (QUICK_ROWS if args.quick else DEFAULT_ROWS)]
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    table: dict[Row, list[dict]] = {}
    for row in args.rows:
        table[row] = run_row(args, row)
        s = summarize(table[row])
        print(
            f"{row.setting} augment={row.augment}: test AUC {s['mean']:.3f} ± {s['sd']:.3f} "
            f"over seeds {args.seeds} ({', '.join(f'{a:.3f}' for a in s['aucs'])})",
            flush=True,
        )
    if args.out:
        args.out.write_text(json.dumps({f"{r.setting}:{r.augment}": v for r, v in table.items()}))
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(args, table, argv))


if __name__ == "__main__":
    main()
