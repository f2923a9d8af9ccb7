"""Rounds and wall time to a target AUC under a hospital's link.

Each arm (a backend and its communication window I, the same T local steps per site) trains
the synthetic federation in-process, as ``benchmarks/claims/communication.py`` does, and its
store keeps, per site and round, the bytes it downloaded and uploaded and its training speed.
The replay puts every site behind the given downlink and uplink (each site its own link, the
coordinator's link not the limit) and adds up, round after round,

    round time = max over the round's sites of (down / downlink + training + up / uplink)

where training = local steps × batch ÷ the images per second the node measured. The first round
whose pooled test AUC reaches the target gives the rounds and the wall time to it; "—" where
the arm never reaches it. The target is the same for every arm: by default the lowest of the
arms' best pooled test AUCs less 0.01, so the table compares arms at an accuracy all of them
reach (a reporting threshold, chosen from no arm's own validation).

    python -m benchmarks.systems.link_replay --quick
    python -m benchmarks.systems.link_replay --model densenet121 --image-size 32
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common.fragment import emit, provenance

LINKS_MBIT = ((10, 10), (50, 50), (1000, 1000))  # (downlink, uplink), Mbit/s
ARMS = (("codasca", 4), ("codasca", 16), ("coda_plus", 4), ("coda_plus", 16))
COMPRESSION = ("none",)  # --compress: each arm with each of these


@dataclass(frozen=True)
class SiteCost:
    """One site's round: bytes each way and its training time."""

    bytes_down: int
    bytes_up: int
    train_s: float


@dataclass(frozen=True)
class RoundCost:
    """One round: its sites' costs and the pooled test AUC of the model it ended with."""

    round: int
    sites: tuple[SiteCost, ...]
    auc: float | None


def round_seconds(cost: RoundCost, downlink_mbit: float, uplink_mbit: float) -> float:
    """The slowest site's download, training and upload: the round waits for it."""
    down, up = downlink_mbit * 1e6 / 8, uplink_mbit * 1e6 / 8  # bytes per second
    return max((s.bytes_down / down + s.train_s + s.bytes_up / up for s in cost.sites), default=0.0)


def replay(costs: Sequence[RoundCost], downlink_mbit: float, uplink_mbit: float) -> list[float]:
    """The wall time at the end of each round, under the link."""
    elapsed, out = 0.0, []
    for cost in costs:
        elapsed += round_seconds(cost, downlink_mbit, uplink_mbit)
        out.append(elapsed)
    return out


def to_target(costs: Sequence[RoundCost], times: Sequence[float], target: float):
    """(rounds, seconds) at the first round whose AUC reaches ``target``; None if none does."""
    for cost, elapsed in zip(costs, times, strict=True):
        if cost.auc is not None and cost.auc >= target:
            return cost.round, elapsed
    return None


def costs_of_run(runs_dir: str | Path, run_id: str, batch_size: int) -> list[RoundCost]:
    """Every trained round of a run, from its store rows."""
    from fed_auc.store.run_store import RunStore

    with RunStore(runs_dir) as store:
        rounds = store.rounds(run_id).set_index("round")
        site_rounds = store.site_rounds(run_id)
    out = []
    for number, group in site_rounds[site_rounds["round"] > 0].groupby("round"):
        sites = []
        for row in group.itertuples():
            if row.status != "completed":
                continue
            compute = json.loads(row.metrics or "{}").get("compute", {})
            rate = compute.get("images_per_s") or 0.0
            train = (row.steps or 0) * batch_size / rate if rate > 0 else 0.0
            sites.append(SiteCost(int(row.bytes_down or 0), int(row.bytes_up or 0), train))
        auc = rounds.loc[number, "global_auc"]
        out.append(RoundCost(int(number), tuple(sites), None if auc != auc else float(auc)))
    return out


def train_arm(
    algorithm: str, window: int, steps: int, seed: int, options: dict, compress: str = "none"
) -> dict:
    """Train one arm (T = ``steps`` local steps per site, rounds of I = ``window``, requests
    and replies as ``compress`` sends them), evaluated every round; its round costs."""
    import torch

    from fed_auc.experiment.config import ExperimentConfig
    from fed_auc.simulation import run_simulation

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as runs_dir:
        summary = run_simulation(
            ExperimentConfig(
                algorithm=algorithm,
                rounds=steps // window,
                local_steps=window,
                eval_every=1,
                select="last",
                seed=seed,
                runs_dir=runs_dir,
                compress=compress,
                **options,
            )  # fmt: skip
        )
        costs = costs_of_run(runs_dir, summary["run_id"], options["batch_size"])
    return {"algorithm": algorithm, "window": window, "seed": seed, "costs": costs,
            "compress": compress}  # fmt: skip


def table(arms: list[dict], target: float | None, links=LINKS_MBIT) -> tuple[str, float]:
    """Markdown: per arm, rounds and wall time to the target under each link."""
    best = [max((c.auc for c in a["costs"] if c.auc is not None), default=0.0) for a in arms]
    target = min(best) - 0.01 if target is None else target
    head = " | ".join(f"{d}/{u} Mbit/s: rounds, time" for d, u in links)
    lines = [
        f"| backend | I | compress | rounds run | MB per round (all sites, both ways) | best AUC "
        f"| {head} |",
        "|---|---|---|---|---|---|" + "---|" * len(links),
    ]
    for arm, top in zip(arms, best, strict=True):
        costs = arm["costs"]
        mb = sum(s.bytes_down + s.bytes_up for c in costs for s in c.sites) / len(costs) / 1e6
        cells = []
        for down, up in links:
            reached = to_target(costs, replay(costs, down, up), target)
            cells.append("—" if reached is None else f"{reached[0]}, {reached[1]:.1f} s")
        lines.append(f"| {arm['algorithm']} | {arm['window']} | {arm.get('compress', 'none')} "
                     f"| {len(costs)} | {mb:.2f} | "
                     f"{top:.3f} | " + " | ".join(cells) + " |")  # fmt: skip
    return "\n".join(lines), target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, T = 32, one seed")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--steps", type=int, default=64, help="T: local steps per site")
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-scale", type=float, default=1.0)
    parser.add_argument("--target", type=float, help="pooled test AUC (default: see above)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--arms",
        default=",".join(f"{a}:{i}" for a, i in ARMS),
        help="comma-separated BACKEND:I (default: CODASCA and CODA+ at I = 4 and 16)",
    )
    parser.add_argument(
        "--compress",
        default=",".join(COMPRESSION),
        help="comma-separated: every arm with each (none, fp16, int8)",
    )
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    modes = args.compress.split(",")
    arms = [(a, int(i)) for a, _, i in (arm.partition(":") for arm in args.arms.split(","))]
    if args.quick:
        args.steps, args.data_scale = 32, 0.5
    options = {"model": args.model, "image_size": args.image_size, "sites": args.sites,
               "partition": "imratio:" + ",".join(["0.1"] * args.sites),
               "data_scale": args.data_scale, "batch_size": 32}  # fmt: skip
    start = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        futures = [pool.submit(train_arm, a, i, args.steps, args.seed, options, mode)
                   for a, i in arms for mode in modes]  # fmt: skip
        trained = [f.result() for f in futures]
    text, target = table(trained, args.target)
    header = provenance(
        str(args.seed),
        time.perf_counter() - start,
        f"Synthetic federation, {args.sites} sites at 10 % training positives, {args.model} at "
        f"{args.image_size} px, batch 32, T = {args.steps} local steps per site; target pooled "
        f"test AUC {target:.3f}.",
    )
    emit(header + "\n\n" + text + "\n", args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
