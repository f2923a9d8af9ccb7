"""External validation (issue 21): each site's AUC when the model never trained on it, beside its
AUC when it did, and the time of a federated evaluation job next to a local one.

For every seed: one federation trained with all sites and one per site without it
(``fed_auc.run.holdout.leave_each_out`` over ``run_simulation`` with ``hold_out``); each export is
scored at every site by the evaluation job (node-side bootstrap CI). Per site: held-out and
in-federation test AUC, mean ± sd over seeds, and the paired difference (held out − in) with
its 95 % t-interval. Timing: the evaluation job over in-process nodes (``run_job`` on a
``LocalTransport``: per-site reports, pooled AUC from binned counts) against local
``fed_auc.evaluate.local.evaluate_model`` (per-image scores pooled) on the same model and test
splits, both with 1000 bootstrap resamples, alternated, median of repeats; one torch thread.

    python -m benchmarks.claims.external_validation --federation synthetic --seeds 0 1 2
    python -m benchmarks.claims.external_validation --federation breastmnist --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common.paths import BREASTMNIST
from benchmarks.common.stats import paired_ci
from fed_auc.evaluate.job import model_request, run_job
from fed_auc.evaluate.local import evaluate_model
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.node.build import build_node
from fed_auc.registry.load import load_registered_model
from fed_auc.run.holdout import leave_each_out
from fed_auc.simulation import load_in_process_sites, run_simulation
from fed_auc.transport.local import LocalTransport

FEDERATIONS = {
    "synthetic": {"sites": 4, "rounds": 20},
    "breastmnist": {
        "data": f"medmnist:{BREASTMNIST}",
        "sites": 4,
        "feature_shift": 0.2,  # per-site contrast/brightness: sites differ as scanners do
        "warmup_rounds": 5,
        "rounds": 20,
        "lr": 0.2,
    },
}


def external_validation(federation: str, seed: int, runs: Path) -> list[dict]:
    config = ExperimentConfig(**FEDERATIONS[federation], seed=seed, runs_dir=str(runs))
    names = [s.data.name for s in load_in_process_sites(config)[0]]

    def train(held_out: list[str]) -> dict:
        return run_simulation(dataclasses.replace(config, hold_out=held_out))

    return leave_each_out(names, train)


def evaluation_times(federation: str, model_path: str, runs: Path, repeats: int) -> dict:
    """Seconds of the in-process evaluation job and of local evaluate on the same test splits."""
    config = ExperimentConfig(**FEDERATIONS[federation], runs_dir=str(runs))
    sites = load_in_process_sites(config)[0]
    model, card = load_registered_model(model_path)
    request, tensors, _ = model_request(model_path, ["test"], 1000, 0)
    setup = config.node_setup("timing", request.model_config, 1, len(sites))
    nodes = [build_node(setup, s.data, s.hosting, runs / "timing" / s.data.name) for s in sites]
    transport = LocalTransport(nodes, [s.hosting for s in sites])
    names = [s.data.name for s in sites]
    splits = {s.data.name: s.data.test for s in sites}
    federated, local = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        run_job(transport, names, request, tensors, [])
        federated.append(time.perf_counter() - start)
        start = time.perf_counter()
        evaluate_model(model, card, splits, n_boot=1000, seed=0)
        local.append(time.perf_counter() - start)
    return {"federated_s": statistics.median(federated), "local_s": statistics.median(local)}


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def paired(diffs: list[float]) -> str:
    mean, lo, hi = paired_ci(diffs)
    if len(diffs) < 2:
        return f"{mean:+.3f}"
    return f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--federation", choices=sorted(FEDERATIONS), default="synthetic")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeats", type=int, default=5, help="timing repeats (median)")
    parser.add_argument("--out", type=Path, help="also write the raw rows as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows: dict[str, dict[str, list[float]]] = {}
    raw = []
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        for seed in args.seeds:
            for row in external_validation(args.federation, seed, Path(tmp) / f"seed{seed}"):
                raw.append({**row, "seed": seed})
                site = rows.setdefault(row["site"], {"held": [], "in": []})
                held, within = row["held_out_auc"], row["in_federation_auc"]
                if held and within and held[0] is not None and within[0] is not None:
                    site["held"].append(held[0])
                    site["in"].append(within[0])
        trained_s = time.perf_counter() - started
        model = next(Path(tmp).glob("seed*/*/model/model.pt"))
        times = evaluation_times(args.federation, str(model), Path(tmp), args.repeats)
    print(f"## {args.federation}: seeds {args.seeds}, {FEDERATIONS[args.federation]}")
    print(f"load average {os.getloadavg()[0]:.1f}; {trained_s:.0f} s of training runs\n")
    print("| site | held-out test AUC | in-federation test AUC | held − in (95 % CI) | seeds |")
    print("|---|---|---|---|---|")
    for site, v in rows.items():
        diffs = [h - i for h, i in zip(v["held"], v["in"], strict=True)]
        print(f"| {site} | {mean_sd(v['held'])} | {mean_sd(v['in'])} | {paired(diffs)} "
              f"| {len(diffs)} |")  # fmt: skip
    ratio = times["federated_s"] / times["local_s"]
    print(f"\nevaluation of one model at {len(rows)} sites (1000 bootstrap resamples, median of "
          f"{args.repeats}): federated job {times['federated_s']:.3f} s, local evaluate "
          f"{times['local_s']:.3f} s, ratio {ratio:.2f}")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"rows": raw, "times": times}, indent=2))


if __name__ == "__main__":
    main()
