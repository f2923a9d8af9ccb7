"""Faults a federation meets: runs killed with SIGKILL and resumed (compared with the
uninterrupted run), nodes that fail or stay silent, and every kind of hostile reply."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from fed_auc.data.synthetic import DEFAULT_PROFILES
from fed_auc.exchange import Reply
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import load_torch
from fed_auc.node.node import Node
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore

SMALL = {"sites": 3, "rounds": 6, "local_steps": 2, "seed": 11, "data_scale": 0.4}
BAD = DEFAULT_PROFILES[1].name  # the site that fails or turns hostile


def rounds_in(runs: Path) -> int:
    if not (runs / "fed_auc.sqlite").exists():
        return -1
    with RunStore(runs) as store:
        runs_frame = store.runs()
        last = None if runs_frame.empty else store.last_round(runs_frame["id"].iloc[0])
    return -1 if last is None else last


def final_tensors(summary: dict) -> dict[str, torch.Tensor]:
    exported = load_torch(summary["model_path"])
    return {**exported["state_dict"], **{"auc/" + k: v for k, v in exported["auc"].items()}}


def crash_and_resume(kills: int, workdir: Path, small: dict = SMALL) -> dict:
    """Kill a CLI run with SIGKILL after a random delay, resume it, compare with a clean run."""
    reference = run_simulation(ExperimentConfig(runs_dir=str(workdir / "clean"), **small))
    clean = final_tensors(reference)
    rng = random.Random(0)
    out = {"injected": 0, "not_injected": 0, "completed": 0, "lost": 0, "duplicated": 0}
    out["max_diff"] = 0.0
    config = workdir / "small.toml"
    config.write_text("".join(f"{k} = {v}\n" for k, v in small.items()))
    for kill in range(kills):
        runs = workdir / f"kill{kill}"
        log = (workdir / f"kill{kill}.log").open("w")
        process = subprocess.Popen(
            [sys.executable, "-m", "fed_auc.cli", "simulate", "--config", str(config)]
            + ["--runs-dir", str(runs)],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        target = rng.randint(0, small["rounds"] - 2)  # kill somewhere after this round
        while rounds_in(runs) < target and process.poll() is None:
            time.sleep(0.02)
        time.sleep(rng.uniform(0, 0.5))
        if process.poll() is not None:  # ended before the kill: not a fault injected
            out["not_injected"] += 1
            print(f"kill {kill}: run ended first ({process.returncode}); see {log.name}")
            continue
        process.send_signal(signal.SIGKILL)
        process.wait()
        out["injected"] += 1
        with RunStore(runs) as store:
            run_id = store.runs()["id"].iloc[0]
        resumed = subprocess.run(
            [sys.executable, "-m", "fed_auc.cli", "simulate", "--resume", run_id]
            + ["--runs-dir", str(runs), "--json"],
            capture_output=True,
            text=True,
        )
        if resumed.returncode != 0:
            print(resumed.stderr, file=sys.stderr)
            continue
        summary = json.loads(resumed.stdout)
        with RunStore(runs) as store:
            rounds = store.rounds(run_id)["round"].tolist()
            status = store.run(run_id)["status"]
        expected = list(range(small["rounds"] + 1))
        out["lost"] += len(set(expected) - set(rounds))
        out["duplicated"] += len(rounds) - len(set(rounds))
        out["completed"] += status == "completed"
        diff = max(float((final_tensors(summary)[n] - t).abs().max()) for n, t in clean.items())
        out["max_diff"] = max(out["max_diff"], diff)
    return out


def with_node_behaviour(behaviour: Callable, runs: Path, small: dict = SMALL, **changes) -> dict:
    """Run ``small`` with ``Node.train`` of the bad site replaced by ``behaviour``."""
    original = Node.train

    def train(self, broadcast):
        if self.name != BAD:
            return original(self, broadcast)
        return behaviour(self, broadcast, original)

    Node.train = train
    try:
        return run_simulation(ExperimentConfig(runs_dir=str(runs), **{**small, **changes}))
    finally:
        Node.train = original


def flaky_nodes(runs: int, workdir: Path, small: dict = SMALL) -> dict:
    """Each reply of the bad site fails (error or silence) with probability 1/2."""
    rng = random.Random(1)
    out = {"runs": runs, "completed": 0, "faults": 0, "lost": 0}

    def flaky(self, broadcast, original):
        if rng.random() < 0.5:
            out["faults"] += 1
            raise TimeoutError("no answer before the deadline")
        return original(self, broadcast)

    for i in range(runs):
        summary = with_node_behaviour(flaky, workdir / f"flaky{i}", small)
        with RunStore(workdir / f"flaky{i}") as store:
            rounds = store.rounds(summary["run_id"])["round"].tolist()
            out["completed"] += store.run(summary["run_id"])["status"] == "completed"
        out["lost"] += small["rounds"] + 1 - len(rounds)
    return out


def _first(reply: Reply) -> str:
    return next(n for n in reply.tensors if n.startswith("w/"))


def _set(reply: Reply, name: str, value: torch.Tensor) -> None:
    reply.tensors[name] = value


def _scale(reply: Reply, prefix: str, factor: float) -> None:
    for name in [n for n in reply.tensors if n.startswith(prefix)]:
        reply.tensors[name] = reply.tensors[name] * factor


@dataclass(frozen=True)
class Hostile:
    """A tampering of the bad site's replies, in runs of ``algorithm``, in ``phase`` only
    (None: every phase)."""

    tamper: Callable[[Reply], None]
    algorithm: str = "codasca"
    phase: str | None = None


HOSTILE: dict[str, Hostile] = {
    "NaN": Hostile(lambda r: r.tensors[_first(r)].view(-1).__setitem__(0, float("nan"))),
    "Inf": Hostile(lambda r: _set(r, "auc/a", torch.full_like(r.tensors["auc/a"], float("inf")))),
    "wrong name": Hostile(lambda r: _set(r, "w/evil", r.tensors.pop(_first(r)))),
    "wrong shape": Hostile(lambda r: _set(r, _first(r), r.tensors[_first(r)].flatten()[:-1])),
    "wrong dtype": Hostile(lambda r: _set(r, _first(r), r.tensors[_first(r)].half())),
    "oversized payload": Hostile(lambda r: _set(r, "w/padding", torch.zeros(5_000_000))),
    "absurd norm": Hostile(lambda r: _scale(r, "w/", 1e6)),
    "duplicated site id": Hostile(lambda r: setattr(r, "site", DEFAULT_PROFILES[0].name)),
    "wrong round": Hostile(lambda r: setattr(r, "round", r.round - 1)),
    # counts and scalars: each checked against what the request asked (issue 18, item 7)
    "steps = 0": Hostile(lambda r: setattr(r, "steps", 0)),
    "steps > asked": Hostile(lambda r: setattr(r, "steps", 10**6)),
    "inflated num_examples (Fed-Norm-SGDA)": Hostile(
        lambda r: setattr(r, "num_examples", 10**9), "fed_norm_sgda"
    ),
    "a_norm = 1e12 (Fed-Norm-SGDA)": Hostile(
        lambda r: r.metrics.__setitem__("a_norm", 1e12), "fed_norm_sgda"
    ),
    "absurd normalized direction (Fed-Norm-SGDA)": Hostile(
        lambda r: _scale(r, "g/", 1e6), "fed_norm_sgda"
    ),
    "absurd full gradient (FedSGDA-MB collect)": Hostile(
        lambda r: _scale(r, "g/", 1e6), "fedsgda_mb", "collect"
    ),
}


def hostile_replies(workdir: Path, small: dict = SMALL) -> dict:
    """Every kind of hostile reply from one site in every round; count what got averaged in."""
    out = {"tried": 0, "averaged": 0, "events": 0, "runs_completed": 0, "kinds": len(HOSTILE)}
    out["lost"] = 0
    for i, kind in enumerate(HOSTILE.values()):

        def hostile(self, broadcast, original, kind=kind):
            reply = original(self, broadcast)
            if kind.phase is None or broadcast.phase == kind.phase:
                kind.tamper(reply)
            return reply

        runs = workdir / f"hostile{i}"
        summary = with_node_behaviour(
            hostile, runs, small, max_update_norm=1e3, algorithm=kind.algorithm
        )
        with RunStore(runs) as store:
            rows = store.site_rounds(summary["run_id"]).query("round > 0 and site == @BAD")
            events = store.events(summary["run_id"]).query("site == @BAD")
            out["lost"] += small["rounds"] + 1 - len(store.rounds(summary["run_id"]))
            out["runs_completed"] += store.run(summary["run_id"])["status"] == "completed"
        out["tried"] += len(rows)
        out["averaged"] += int((rows["status"] == "completed").sum())
        out["events"] += int(events["message"].str.contains("rejected").sum())
    return out
