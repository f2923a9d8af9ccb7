"""Per-round overhead of fed-auc's Flower transport vs. a naive one, and vs. in-process.

Three runs of the same federation (same seed, data and model), one after the other:

- ``in-process``: ``fed-auc simulate``'s transport (nodes called directly);
- ``flower``: a SuperLink, three ``fed-auc node`` processes on loopback and the ServerApp,
  payloads packed into one buffer per dtype (fed-auc's transport);
- ``naive``: the same, but every tensor travels as its own Flower array (as a state_dict
  turned into an ``ArrayRecord`` does; raw bytes, so no NumPy serialization is counted).

Every node's compute (training and evaluation, timed inside the node) is logged; a round's
overhead is its wall time minus the slowest site's compute in it. Bytes per round are the
tensor payloads the coordinator records (down + up), the same for every transport.

    python benchmarks/flower_overhead.py --rounds 2 --model densenet121 --image-size 32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from fed_auc.node import Node
from fed_auc.simulation import SimulationConfig, run_simulation
from fed_auc.store import RunStore
from fed_auc.transport.flower_codec import PER_TENSOR_ENV
from fed_auc.transport.flower_launch import free_port

HOSPITALS = Path(__file__).resolve().parents[1] / "hospitals"
SITES = ["st_elsewhere", "county_general", "mercy_rural"]


def serve_node(site_toml: str, coordinator: str, timings: str) -> None:
    """``fed-auc node --insecure``, with the worker's compute per request appended to a file."""
    from fed_auc.transport.flower_launch import run_node
    from fed_auc.transport.flower_worker import NodeWorker, SiteConfig

    original = NodeWorker.handle

    def timed(self, header, buffers):
        start = time.perf_counter()
        answer = original(self, header, buffers)
        record = {"site": self.site.name, "kind": header["kind"], "round": header.get("round")}
        with open(timings, "a") as out:
            out.write(json.dumps({**record, "s": time.perf_counter() - start}) + "\n")
        return answer

    NodeWorker.handle = timed
    run_node(SiteConfig.from_toml(site_toml), coordinator, None, None)


def compute_per_round(events: list[dict]) -> dict[int, float]:
    """Slowest site's training + evaluation time per round (round 1, 2, ...)."""
    per_site: dict[str, dict[int, float]] = {}
    for site in {e["site"] for e in events}:
        trains = [e for e in events if e["site"] == site and e["kind"] == "train"]
        evals = [e["s"] for e in events if e["site"] == site and e["kind"] == "evaluate"]
        per_site[site] = {
            e["round"] + 1: e["s"] + (evals[e["round"] + 1] if e["round"] + 1 < len(evals) else 0)
            for e in trains
        }
    rounds = sorted({r for times in per_site.values() for r in times})
    return {r: max(times.get(r, 0.0) for times in per_site.values()) for r in rounds}


def round_rows(runs: Path) -> list[dict]:
    with RunStore(runs) as store:
        run_id = store.runs()["id"].iloc[-1]
        rows = store.rounds(run_id).query("round > 0")
    return [
        {"round": int(r.round), "s": float(r.duration_s), "bytes": int(r.bytes_down + r.bytes_up)}
        for r in rows.itertuples()
    ]


def in_process(options: dict, work: Path) -> list[dict]:
    events: list[dict] = []
    train, evaluate = Node.train, Node.evaluate

    def timed_train(self, broadcast):
        start = time.perf_counter()
        reply = train(self, broadcast)
        events.append({"site": self.name, "kind": "train", "round": broadcast.round,
                       "s": time.perf_counter() - start})  # fmt: skip
        return reply

    def timed_evaluate(self, tensors, *args, **kwargs):
        start = time.perf_counter()
        result = evaluate(self, tensors, *args, **kwargs)
        events.append({"site": self.name, "kind": "evaluate", "s": time.perf_counter() - start})
        return result

    Node.train, Node.evaluate = timed_train, timed_evaluate
    try:
        run_simulation(SimulationConfig(runs_dir=str(work / "runs"), **options))
    finally:
        Node.train, Node.evaluate = train, evaluate
    return _rounds(round_rows(work / "runs"), compute_per_round(events))


def over_flower(options: dict, work: Path, naive: bool) -> list[dict]:
    port = free_port()
    lines = [f"{k} = {json.dumps(v)}" for k, v in {**options, "runs_dir": "runs"}.items()]
    lines += ["[flower]", f'address = "127.0.0.1:{port}"', "min_nodes = 3", "insecure = true"]
    (work / "exp.toml").write_text("\n".join(lines) + "\n")
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", PER_TENSOR_ENV: "1" if naive else "0"}
    timings = work / "timings.jsonl"
    nodes = []
    for index, site in enumerate(SITES):
        text = (HOSPITALS / f"{site}.toml").read_text().split("\n[node]")[0]
        toml = work / f"{site}.toml"
        toml.write_text(f'{text}\n[node]\nindex = {index}\nstate_dir = "{work / site}"\n')
        command = [sys.executable, __file__, "node", str(toml), f"127.0.0.1:{port}", str(timings)]
        with open(work / f"{site}.log", "w") as log:
            nodes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        command = [sys.executable, "-m", "fed_auc.cli", "coordinator"]
        command += ["--config", str(work / "exp.toml"), "--json"]
        with open(work / "coordinator.log", "w") as log:
            subprocess.run(command, env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT,
                           check=True)  # fmt: skip
    finally:
        for node in nodes:
            node.terminate()
        for node in nodes:
            node.wait(timeout=60)
    events = [json.loads(line) for line in timings.read_text().splitlines()]
    events = [e for e in events if e["kind"] != "register"]
    return _rounds(round_rows(work / "runs"), compute_per_round(events))


def _rounds(rows: list[dict], compute: dict[int, float]) -> list[dict]:
    return [{**r, "compute": compute[r["round"]], "overhead": r["s"] - compute[r["round"]]}
            for r in rows]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default="densenet121")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--local-steps", type=int, default=8)
    parser.add_argument("--data-scale", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--work-dir", type=Path, help="keep logs and stores here (default: temp)")
    parser.add_argument("--transports", default="in-process,flower,naive", help="which to run")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # every process: 3 nodes share the CPUs
    torch.set_num_threads(args.threads)
    options = {
        "algorithm": "codasca",
        "sites": len(SITES),
        "rounds": args.rounds,
        "local_steps": args.local_steps,
        "model": args.model,
        "image_size": args.image_size,
        "data_scale": args.data_scale,
    }
    results: dict[str, list[dict]] = {}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.transports.split(","):
            work = (args.work_dir or Path(tmp)) / name
            work.mkdir(parents=True)
            start = time.perf_counter()
            try:
                if name == "in-process":
                    results[name] = in_process(options, work)
                else:
                    results[name] = over_flower(options, work, naive=name == "naive")
            except subprocess.CalledProcessError as exc:  # a transport that cannot finish
                failed[name] = f"{exc.cmd[3]} exited with status {exc.returncode}"
            print(f"{name}: {time.perf_counter() - start:.0f} s in all", file=sys.stderr)
    if not results:
        raise SystemExit(f"no transport finished: {failed}")
    base = statistics.mean(r["s"] for r in results.get("in-process", next(iter(results.values()))))
    print("| transport | round s | slowest node compute s | overhead s | × in-process | MB/round |")
    print("|---|---|---|---|---|---|")
    for name, reason in failed.items():
        print(f"| {name} | failed: {reason} | | | | |")
    for name, rows in results.items():
        mean = {k: statistics.mean(r[k] for r in rows) for k in ("s", "compute", "overhead")}
        mb = statistics.mean(r["bytes"] for r in rows) / 1e6
        print(f"| {name} | {mean['s']:.1f} | {mean['compute']:.1f} | {mean['overhead']:.1f} "
              f"| {mean['s'] / base:.2f} | {mb:.1f} |")  # fmt: skip
    print(json.dumps(results), file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "node":
        serve_node(*sys.argv[2:5])
    else:
        main()
