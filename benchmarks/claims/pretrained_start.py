"""Starting a federation from earlier weights (``--init``, issue 31).

Two measurements:

1. Each accepted format: the time to read, check and map the file onto the network
   (``read_init`` + ``apply_init``) beside the time to build the same network from random
   weights (the baseline, side by side, as a ratio), and the round-0 pooled test AUC of a
   BreastMNIST federation started from it. No real pretrained file can be downloaded here:
   the DenseNet121 files are random values under each format's key names (their load time is
   real, their round-0 AUC is that of random weights); the registered model is the FedAvg-CE
   model of part 2, whose round-0 AUC must equal its card's test AUC.
2. The two-stage recipe of the papers across runs, paired by seed on BreastMNIST (5 %
   positives per site, 4 sites): CODASCA from random weights; CODASCA started with ``--init``
   from a FedAvg-CE model an earlier federation registered (its rounds = the warm-up's); and,
   as the reference, CODASCA with the same number of fedavg + CE warm-up rounds inside the run.

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
BASE = ["--model", "tiny", "--lr", "0.8", "--select", "best_val:5"]
ARMS = ("CODASCA from random", "CODASCA --init FedAvg-CE model", "CODASCA, in-run warm-up")


def cli(runs: Path, seed: int, *options: str) -> list[str]:
    fed_auc = str(Path(sys.executable).parent / "fed-auc")
    data = breast("imratio:0.05,0.05,0.05,0.05", NPZ)
    return [fed_auc, "--threads", "1", "simulate", *data, *BASE, *options,
            "--seed", str(seed), "--json", "--runs-dir", str(runs)]  # fmt: skip


def one_seed(seed: int, root: Path, warmup: int = WARMUP, rounds: int = ROUNDS) -> dict[str, Any]:
    """The three arms of one seed; the registered FedAvg-CE model's folder and card."""
    runs, models = root / f"runs{seed}", root / "models"
    codasca = ["--algorithm", "codasca", "--rounds", str(rounds), *AUC_RECIPE]
    out: dict[str, Any] = {}
    _, out[ARMS[0]] = simulate(cli(runs, seed, *codasca, "--warmup-rounds", "0"))
    name = f"fedavg_ce_{seed}"
    stage1 = ["--algorithm", "fedavg", "--rounds", str(warmup), "--select", "last",
              "--register", name, "--models-dir", str(models)]  # fmt: skip
    _, out["registered"] = simulate(cli(runs, seed, *stage1))
    init = ["--init", str(models / name), "--warmup-rounds", "0"]
    summary, out[ARMS[1]] = simulate(cli(runs, seed, *codasca, *init))
    out["round0"] = summary["global_auc"][0]
    warm = ["--warmup-rounds", str(warmup), "--warmup-head", "recenter"]
    _, out[ARMS[2]] = simulate(cli(runs, seed, *codasca, *warm))
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
    results: dict[int, dict], rows: list[tuple[str, float, float, Any]], warmup: int = WARMUP
) -> str:
    """The formats table, whether every --init run's round 0 equals its registered model's
    card, and the arms' AUCs with each one's paired difference to CODASCA from random."""
    lines = ["| format | load + map (s) | random init (s) | ratio | round-0 test AUC |",
             "|---|---|---|---|---|"]  # fmt: skip
    for label, load, build, auc in rows:
        shown = "undefined" if auc is None else f"{auc:.3f}"
        lines.append(f"| {label} | {load:.2f} | {build:.2f} | {load / build:.2f} | {shown} |")
    seeds = sorted(results)
    exact = all(results[s]["round0"] == results[s]["registered"]["global_auc"] for s in seeds)
    lines += ["", f"Round 0 of every `--init` run equals its registered model's card test AUC: "
              f"{'yes' if exact else 'NO'} ({len(seeds)} of {len(seeds)} seeds compared).", "",
              "| arm | validation AUC | test AUC | Δ test vs from random [95 % CI] | per seed |",
              "|---|---|---|---|---|"]  # fmt: skip
    base = [results[s][ARMS[0]]["global_auc"] for s in seeds]
    for arm in ARMS:
        test = [results[s][arm]["global_auc"] for s in seeds]
        val = [results[s][arm]["global_val_auc"] for s in seeds]
        diff = "—"
        if arm != ARMS[0]:
            mean, lo, hi = paired_ci([t - b for t, b in zip(test, base, strict=True)])
            diff = f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]"
        per_seed = " ".join(f"{t:.3f}" for t in test)
        lines.append(f"| {arm} | {_ms(val)} | {_ms(test)} | {diff} | {per_seed} |")
    ce = [results[s]["registered"]["global_auc"] for s in seeds]
    lines.append(f"| (FedAvg-CE, {warmup} rounds, the registered model) | — | {_ms(ce)} | — | "
                 + " ".join(f"{t:.3f}" for t in ce) + " |")  # fmt: skip
    return "\n".join(lines)


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
        "export best_val:5; one torch thread per run."
    )
    head = provenance(" ".join(map(str, seeds)), time.perf_counter() - started, settings)
    emit(head + "\n\n" + tables(results, rows, warmup) + "\n", args.markdown)


if __name__ == "__main__":
    main()
