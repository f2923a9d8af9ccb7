"""Starting a federation from earlier weights (``--init``), against FedAvg-CE at equal budget.

Two measurements:

1. Each accepted format: the time to read, check and map the file onto the network
   (``read_init`` + ``apply_init``) beside the time to build the same network from random
   weights (the baseline, side by side, as a ratio), and the round-0 pooled test AUC of a
   BreastMNIST federation started from it. No real pretrained file can be downloaded here:
   the DenseNet121 files are random values under each format's key names (their load time is
   real, their round-0 AUC is that of random weights); the registered model is the FedAvg-CE
   model of part 2, whose round-0 AUC must equal its card's test AUC.
2. The two-stage recipe of the papers across runs, paired by seed on BreastMNIST (5 %
   positives per site, 4 sites), every comparison against a FedAvg-CE control with the same
   total rounds, local steps, export rule (``best_val:5`` over the whole run) and seeds:
   CODASCA from random against FedAvg-CE from random (15 rounds each); CODASCA started with
   ``--init`` from a FedAvg-CE model an earlier federation registered (5 + 15 rounds) against
   FedAvg-CE continued from the same registered model (5 + 15) and against FedAvg-CE from
   random for 20 rounds; CODASCA after an in-run fedavg + CE warm-up (5 + 15) against the
   same 20 FedAvg-CE rounds. ``--early-stop 0``: every arm trains its whole budget.

    python -m benchmarks.claims.pretrained_start --seeds 0 1 2 3 4 5 6 7 8 9 --jobs 2 \\
        --markdown benchmarks/results/pretrained_start.md
    python -m benchmarks.claims.pretrained_start --quick     # 2 seeds, 2 + 3 rounds
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.fragment import emit, provenance
from benchmarks.common.paths import BREASTMNIST as NPZ
from benchmarks.common.simulate import simulate
from benchmarks.common.stats import paired_ci
from benchmarks.rare_positives.auc_vs_ce import AUC_RECIPE, breast

# The rounds of auc_vs_ce's BreastMNIST recipe (tiny network, lr 0.8, 5 + 15 rounds).
WARMUP = 5  # the FedAvg-CE rounds: registered by the earlier federation, or in-run warm-up
ROUNDS = 15  # CODASCA's rounds in every arm
QUICK = (2, 3)  # --quick: warm-up and CODASCA rounds
BASE = ["--model", "tiny", "--lr", "0.8", "--select", "best_val:5", "--early-stop", "0"]
FROM_RANDOM = "CODASCA from random"
CE_FROM_RANDOM = "FedAvg-CE from random"
INIT = "CODASCA --init FedAvg-CE model"
CE_INIT = "FedAvg-CE --init FedAvg-CE model (continued)"
WARM = "CODASCA, in-run warm-up"
CE_TOTAL = "FedAvg-CE from random, warm-up + CODASCA rounds"
ARMS = (FROM_RANDOM, CE_FROM_RANDOM, INIT, CE_INIT, WARM, CE_TOTAL)
# (contender, its control at the same total rounds, local steps, export rule and seeds)
COMPARISONS = (
    (FROM_RANDOM, CE_FROM_RANDOM),
    (INIT, CE_INIT),
    (INIT, CE_TOTAL),
    (WARM, CE_TOTAL),
    (CE_INIT, CE_TOTAL),
)


def cli(runs: Path, seed: int, *options: str) -> list[str]:
    fed_auc = str(Path(sys.executable).parent / "fed-auc")
    data = breast("imratio:0.05,0.05,0.05,0.05", NPZ)
    return [fed_auc, "--threads", "1", "simulate", *data, *BASE, *options,
            "--seed", str(seed), "--json", "--runs-dir", str(runs)]  # fmt: skip


def one_seed(seed: int, root: Path, warmup: int = WARMUP, rounds: int = ROUNDS) -> dict[str, Any]:
    """Every arm of one seed; the registered FedAvg-CE model's folder and card."""
    runs, models = root / f"runs{seed}", root / "models"
    codasca = ["--algorithm", "codasca", "--rounds", str(rounds), *AUC_RECIPE]
    fedavg = ["--algorithm", "fedavg", "--loss", "ce", "--warmup-rounds", "0"]
    out: dict[str, Any] = {}
    _, out[FROM_RANDOM] = simulate(cli(runs, seed, *codasca, "--warmup-rounds", "0"))
    _, out[CE_FROM_RANDOM] = simulate(cli(runs, seed, *fedavg, "--rounds", str(rounds)))
    name = f"fedavg_ce_{seed}"
    stage1 = ["--algorithm", "fedavg", "--rounds", str(warmup), "--select", "last",
              "--register", name, "--models-dir", str(models)]  # fmt: skip
    _, out["registered"] = simulate(cli(runs, seed, *stage1))
    init = ["--init", str(models / name), "--warmup-rounds", "0"]
    summary, out[INIT] = simulate(cli(runs, seed, *codasca, *init))
    out["round0"] = summary["global_auc"][0]
    _, out[CE_INIT] = simulate(cli(runs, seed, *fedavg, "--rounds", str(rounds), *init))
    warm = ["--warmup-rounds", str(warmup), "--warmup-head", "recenter"]
    _, out[WARM] = simulate(cli(runs, seed, *codasca, *warm))
    _, out[CE_TOTAL] = simulate(cli(runs, seed, *fedavg, "--rounds", str(warmup + rounds)))
    out["model_dir"] = models / name
    return out


def formats(root: Path, registered: Path, seed: int) -> list[tuple[str, float, float, Any]]:
    """(format, load s, build s, round-0 test AUC) per accepted format."""
    from safetensors.torch import save_file

    from benchmarks.common.weight_files import densenet_file
    from fed_auc.models import build_model
    from fed_auc.registry.init_weights import apply_init, read_init

    torch.manual_seed(0)
    monai = build_model("densenet121").state_dict()
    files = {"fed-auc registered model (tiny)": registered}
    files["MONAI state_dict (.pt)"] = root / "monai.pt"
    torch.save(monai, files["MONAI state_dict (.pt)"])
    files["MONAI state_dict (.safetensors)"] = root / "monai.safetensors"
    save_file({k: v.contiguous() for k, v in monai.items()}, str(root / "monai.safetensors"))
    files["torchvision ImageNet names (.pth)"] = root / "imagenet.pth"
    torch.save(densenet_file("densenet121", 1000, 3), files["torchvision ImageNet names (.pth)"])
    files["torchxrayvision names (.pt)"] = root / "xrv.pt"
    torch.save(densenet_file("densenet121", 18, 1, xrv=True), root / "xrv.pt")
    rows = []
    for label, path in files.items():
        start = time.perf_counter()
        init = read_init(path)
        model = build_model(init.arch, 1, input_norm=init.input_norm)
        apply_init(init, model)
        load = time.perf_counter() - start
        start = time.perf_counter()
        build_model(init.arch, 1)
        build = time.perf_counter() - start
        one = ["--algorithm", "codasca", "--rounds", "1", "--local-steps", "1",
               "--warmup-rounds", "0", "--init", str(path), "--model", init.arch]  # fmt: skip
        summary, _ = simulate(cli(root / "formats", seed, *one))
        rows.append((label, load, build, summary["global_auc"][0]))
    return rows


def tables(
    results: dict[int, dict],
    rows: list[tuple[str, float, float, Any]],
    warmup: int = WARMUP,
    rounds: int = ROUNDS,
) -> str:
    """The formats table, whether every --init run's round 0 equals its registered model's
    card, the arms' AUCs, and each comparison's paired difference to its control at the same
    total rounds."""
    lines = ["| format | load + map (s) | random init (s) | ratio | round-0 test AUC |",
             "|---|---|---|---|---|"]  # fmt: skip
    for label, load, build, auc in rows:
        shown = "undefined" if auc is None else f"{auc:.3f}"
        lines.append(f"| {label} | {load:.2f} | {build:.2f} | {load / build:.2f} | {shown} |")
    seeds = sorted(results)
    exact = all(results[s]["round0"] == results[s]["registered"]["global_auc"] for s in seeds)
    lines += ["", f"Round 0 of every `--init` run equals its registered model's card test AUC: "
              f"{'yes' if exact else 'NO'} ({len(seeds)} of {len(seeds)} seeds compared).", "",
              "| arm | total rounds | validation AUC | test AUC | export from a warm-up or "
              "--init model | per seed |", "|---|---|---|---|---|---|"]  # fmt: skip
    budget = {FROM_RANDOM: rounds, CE_FROM_RANDOM: rounds}
    for arm in ARMS:
        test = [results[s][arm]["global_auc"] for s in seeds]
        val = [results[s][arm]["global_val_auc"] for s in seeds]
        earlier = sum(_earlier_stage(results[s][arm]) for s in seeds)
        total = budget.get(arm, warmup + rounds)
        per_seed = " ".join(f"{t:.3f}" for t in test)
        lines.append(f"| {arm} | {total} | {_ms(val)} | {_ms(test)} | {earlier} of "
                     f"{len(seeds)} | {per_seed} |")  # fmt: skip
    ce = [results[s]["registered"]["global_auc"] for s in seeds]
    lines.append(f"| (FedAvg-CE, {warmup} rounds, the registered model) | {warmup} | — | "
                 f"{_ms(ce)} | — | " + " ".join(f"{t:.3f}" for t in ce) + " |")  # fmt: skip
    lines += ["", "| contender | control at the same total rounds | Δ test AUC [95 % CI] | "
              "ahead on |", "|---|---|---|---|"]  # fmt: skip
    for contender, control in COMPARISONS:
        diffs = [results[s][contender]["global_auc"] - results[s][control]["global_auc"]
                 for s in seeds]  # fmt: skip
        mean, lo, hi = paired_ci(diffs)
        ahead = sum(d > 0 for d in diffs)
        lines.append(f"| {contender} | {control} | {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] | "
                     f"{ahead} of {len(diffs)} |")  # fmt: skip
    return "\n".join(lines)


def _earlier_stage(card: dict[str, Any]) -> bool:
    """Whether the export holds a model made before the run's own rounds (its warm-up's or
    the ``--init`` model)."""
    return any(entry["stage"] != "main" for entry in card.get("selected") or [])


def _ms(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{statistics.fmean(values):.3f} ± {sd:.3f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--quick", action="store_true", help="seeds 0 1, 2 + 3 rounds")
    args = parser.parse_args(argv)
    warmup, rounds = QUICK if args.quick else (WARMUP, ROUNDS)
    seeds = [0, 1] if args.quick else args.seeds
    torch.set_num_threads(1)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with ThreadPoolExecutor(args.jobs) as pool:
            done = list(pool.map(lambda s: one_seed(s, root, warmup, rounds), seeds))
        results = dict(zip(seeds, done, strict=True))
        rows = formats(root, results[seeds[0]]["model_dir"], seeds[0])
    settings = (
        f"BreastMNIST, malignant positive, 4 sites at 5 % positives (imratio), tiny DenseNet, "
        f"28 px, lr 0.8, CODASCA {rounds} rounds with α's step at the prevalence; FedAvg-CE "
        f"{warmup} rounds (registered, then `--init`; or in-run with the head recentered); "
        f"FedAvg-CE controls for {rounds} rounds from random, {rounds} from the registered "
        f"model and {warmup + rounds} from random; export best_val:5 over the whole run, no "
        "early stop; one torch thread per run."
    )
    head = provenance(" ".join(map(str, seeds)), time.perf_counter() - started, settings)
    emit(head + "\n\n" + tables(results, rows, warmup, rounds) + "\n", args.markdown)


if __name__ == "__main__":
    main()
