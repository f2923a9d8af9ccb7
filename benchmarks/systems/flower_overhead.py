"""Per-round overhead of fed-auc's Flower transport vs. a naive one, and vs. in-process.

Three runs of the same federation (same seed, data and model), one after the other:

- ``in-process``: ``fed-auc simulate``'s transport (nodes called directly);
- ``flower``: a SuperLink, three ``fed-auc node`` processes on loopback and the ServerApp,
  payloads packed into one buffer per dtype (fed-auc's transport);
- ``naive``: the same, but every tensor travels as its own Flower array (as a state_dict
  turned into an ``ArrayRecord`` does; raw bytes, so no NumPy serialization is counted).

Every node's compute (training and evaluation, timed inside the node) is logged; a round's
overhead is its wall time minus the slowest site's compute in it. Bytes per round are the
tensor payloads the coordinator records (down + up), the same for every transport; over
Flower, the node also logs the tensor bytes that actually crossed the network (fed-auc's
transport sends tensors a node already holds as content tags).

    python -m benchmarks.systems.flower_overhead --markdown benchmarks/results/flower_overhead.md
    python -m benchmarks.systems.flower_overhead --quick  # tiny model: Flower's fixed costs only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common.paths import ROOT
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.node.node import Node
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore
from fed_auc.transport.flower.codec import PER_TENSOR_ENV
from fed_auc.transport.flower.processes import free_port

HOSPITALS = ROOT / "hospitals"
SITES = ["st_elsewhere", "county_general", "mercy_rural"]


def serve_node(site_toml: str, coordinator: str, timings: str) -> None:
    """``fed-auc node --insecure``, with the worker's compute per request appended to a file."""
    from fed_auc.site import SiteDefinition
    from fed_auc.transport.flower.launch import run_node
    from fed_auc.transport.flower.worker import NodeWorker

    original = NodeWorker.handle

    def timed(self, header, buffers):
        start = time.perf_counter()
        answer = original(self, header, buffers)
        record = {"site": self.site.name, "kind": header["kind"], "round": header.get("round")}
        record["s"] = time.perf_counter() - start
        # bytes that crossed the network for this request (tensor buffers, both ways)
        record["wire"] = sum(map(len, buffers)) + sum(map(len, answer[1]))
        with open(timings, "a") as out:
            out.write(json.dumps(record) + "\n")
        return answer

    NodeWorker.handle = timed
    run_node(SiteDefinition.from_toml(site_toml), coordinator, None, None)


def wire_per_round(events: list[dict]) -> dict[int, int]:
    """Tensor bytes on the wire per round (all sites): its training and the evaluation after."""
    wire: dict[int, int] = {}
    for site in {e["site"] for e in events}:
        evals = [e for e in events if e["site"] == site and e["kind"] == "evaluate"]
        for e in events:
            if e["site"] == site and e["kind"] == "train":
                after = evals[e["round"] + 1]["wire"] if e["round"] + 1 < len(evals) else 0
                wire[e["round"] + 1] = wire.get(e["round"] + 1, 0) + e["wire"] + after
    return wire


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


def in_process(options: dict, work: Path, node: dict | None = None) -> list[dict]:
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
    files = [str(p) for p in site_files(work, options["data_scale"], node)]
    config = {k: v for k, v in options.items() if k != "data_scale"}
    try:
        run_simulation(ExperimentConfig(runs_dir=str(work / "runs"), site_files=files, **config))
    finally:
        Node.train, Node.evaluate = train, evaluate
    return _rounds(round_rows(work / "runs"), compute_per_round(events))


def over_flower(options: dict, work: Path, naive: bool, node: dict | None = None) -> list[dict]:
    port = free_port()
    config = {k: v for k, v in options.items() if k != "data_scale"}  # in the site files
    lines = [f"{k} = {json.dumps(v)}" for k, v in {**config, "runs_dir": "runs"}.items()]
    lines += ["[flower]", f'address = "127.0.0.1:{port}"', "min_nodes = 3", "insecure = true"]
    lines += [f"expected_sites = {len(SITES)}"]
    (work / "exp.toml").write_text("\n".join(lines) + "\n")
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", PER_TENSOR_ENV: "1" if naive else "0"}
    timings = work / "timings.jsonl"
    nodes = []
    for toml in site_files(work, options["data_scale"], node):
        site = toml.stem
        command = [sys.executable, "-m", __spec__.name, "node", str(toml.resolve())]
        command += [f"127.0.0.1:{port}", str(timings.resolve())]
        with open(work / f"{site}.log", "w") as log:
            nodes.append(subprocess.Popen(command, env=env, cwd=ROOT, stdout=log,
                                          stderr=subprocess.STDOUT))  # fmt: skip
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
    wire = wire_per_round(events)
    rows = _rounds(round_rows(work / "runs"), compute_per_round(events))
    return [{**r, "wire": wire.get(r["round"], 0)} for r in rows]


def site_files(work: Path, scale: float, node: dict | None = None) -> list[Path]:
    """The demo hospitals as site files, every split scaled by ``scale`` (as ``data_scale``
    scales the synthetic federation), the same for both transports; ``node``: more [node]
    settings (e.g. the device), added to each file's [node] table, its last."""
    files = []
    for site in SITES:
        text = (HOSPITALS / f"{site}.toml").read_text()
        for split in ("n_train", "n_val", "n_test"):
            n = int(re.search(rf"^{split} = (\d+)", text, flags=re.M).group(1))
            text = re.sub(rf"^{split} = \d+", f"{split} = {max(2, round(n * scale))}", text,
                          flags=re.M)  # fmt: skip
        text = re.sub(r"^state_dir = .*$", f'state_dir = "{work / site}"', text, flags=re.M)
        text += "".join(f"{key} = {json.dumps(value)}\n" for key, value in (node or {}).items())
        path = work / f"{site}.toml"
        path.write_text(text)
        files.append(path)
    return files


def _rounds(rows: list[dict], compute: dict[int, float]) -> list[dict]:
    return [{**r, "compute": compute[r["round"]], "overhead": r["s"] - compute[r["round"]]}
            for r in rows]  # fmt: skip


def measure(
    options: dict, transports: list[str], work_dir: Path, node: dict | None = None
) -> dict[str, dict]:
    """Run each transport on the same federation; per transport its rounds (or why it failed)
    and the load average (1 min) before and after it. ``node``: more [node] settings."""
    results: dict[str, dict] = {}
    for name in transports:
        work = work_dir / name
        work.mkdir(parents=True)
        load = os.getloadavg()[0]
        start = time.perf_counter()
        try:
            if name == "in-process":
                result = {"rounds": in_process(options, work, node)}
            else:
                result = {"rounds": over_flower(options, work, name == "naive", node)}
        except subprocess.CalledProcessError as exc:  # a transport that cannot finish
            result = {"failed": f"{exc.cmd[3]} exited with status {exc.returncode}"}
        result["load"] = [load, os.getloadavg()[0]]
        result["wall_s"] = time.perf_counter() - start
        results[name] = result
        print(f"{name}: {result['wall_s']:.0f} s in all", file=sys.stderr)
    return results


def summarize(results: dict[str, dict]) -> dict[str, dict]:
    """Per transport: mean round, compute and overhead (s), MB per round, × in-process and
    × the naive transport's overhead; None where the reference did not run."""
    means = {}
    for name, result in results.items():
        rows = result.get("rounds")
        if rows:
            keys = [k for k in ("s", "compute", "overhead", "bytes", "wire") if k in rows[0]]
            means[name] = {k: statistics.mean(r[k] for r in rows) for k in keys}
    base = means.get("in-process", {}).get("s")
    naive = means.get("naive", {}).get("overhead")
    for mean in means.values():
        mean["x_in_process"] = mean["s"] / base if base else None
        mean["naive_over_this"] = naive / mean["overhead"] if naive else None
    return means


def table(results: dict[str, dict]) -> str:
    means = summarize(results)
    lines = [
        "| transport | round s | slowest node compute s | overhead s | × in-process "
        "| naive overhead ÷ this | MB/round | MB/round on the wire | load avg before → after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        load = "{:.1f} → {:.1f}".format(*result["load"])
        if name not in means:
            reason = f"{result.get('failed', 'no rounds')} after {result['wall_s']:.0f} s"
            lines.append(f"| {name} | failed: {reason} | | | | | | | {load} |")
            continue
        m = means[name]
        x = "n/a" if m["x_in_process"] is None else f"{m['x_in_process']:.2f}"
        ratio = "n/a" if m["naive_over_this"] is None else f"{m['naive_over_this']:.1f}"
        wire = f"{m['wire'] / 1e6:.1f}" if "wire" in m else "—"
        lines.append(f"| {name} | {m['s']:.1f} | {m['compute']:.1f} | {m['overhead']:.1f} | {x} "
                     f"| {ratio} | {m['bytes'] / 1e6:.1f} | {wire} | {load} |")  # fmt: skip
    return "\n".join(lines)


LEGEND = """\
Overhead = round wall time − the slowest site's compute (training + evaluation, timed in the
node). MB/round = the tensor payload the coordinator records (down + up, all sites); on the
wire = tensor bytes that crossed the network, evaluation included (a tensor a node already
holds travels as a content tag). `flower` and `naive` run the same fed-auc nodes (ClientApp
tasks executed in the warm node process, 0.1 s SuperNode poll of the SuperLink and 5 ms
looks into its own memory for a reply and its chunks, object pulls retried after 20–250 ms
instead of 1–10 s (20–50 ms by a node's executor from its own SuperNode), in-memory
SuperLink state; CODASCA's control-variate change derived on the server, not uploaded);
`naive` sends every tensor as its own Flower array, never a tag and never one copy shared by
the sites of a request, as a state_dict turned into an `ArrayRecord` would. In-process sites
run one after another, so its "overhead" is mostly the other sites' compute. Load average:
1-minute, before → after each transport."""


def machine(threads: int) -> str:
    return (f"{platform.platform()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
            f"{threads} torch thread(s) per process")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 rounds (~3 min)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default="densenet121")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--local-steps", type=int, default=8)
    parser.add_argument("--data-scale", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--work-dir", type=Path, help="keep logs and stores here (default: temp)")
    parser.add_argument("--transports", default="in-process,flower,naive", help="which to run")
    parser.add_argument("--markdown", type=Path, help="write the result table here (Markdown)")
    parser.add_argument(
        "--secure-aggregation", action="store_true", help="the runs use secure aggregation"
    )
    args = parser.parse_args()
    if args.quick:
        args.model = "tiny"
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # every process: 3 nodes share the CPUs
    torch.set_num_threads(args.threads)
    options = {
        "algorithm": "codasca",
        "rounds": args.rounds,
        "local_steps": args.local_steps,
        "model": args.model,
        "image_size": args.image_size,
        "data_scale": args.data_scale,
        "seed": args.seed,
        "secure_aggregation": args.secure_aggregation,
    }
    with tempfile.TemporaryDirectory() as tmp:
        results = measure(options, args.transports.split(","), args.work_dir or Path(tmp))
    if not any("rounds" in r for r in results.values()):
        raise SystemExit(f"no transport finished: {results}")
    text = table(results)
    print(text)
    print(json.dumps(results), file=sys.stderr)
    if args.markdown:
        command = " ".join(["python -m benchmarks.systems.flower_overhead", *sys.argv[1:]])
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(
            f"`{command}`\n\n{machine(args.threads)}; seed {args.seed}; "
            f"CODASCA{' with secure aggregation' if args.secure_aggregation else ''}, "
            f"{args.model} at {args.image_size} px, 3 sites ({', '.join(SITES)}), "
            f"I = {args.local_steps}, data_scale {args.data_scale}, {args.rounds} rounds.\n\n"
            f"{text}\n\n{LEGEND}\n"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "node":
        serve_node(*sys.argv[2:5])
    else:
        main()
