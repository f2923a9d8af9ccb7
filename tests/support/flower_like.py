"""Flower's node path without Flower: a transport that drives NodeWorker through encoded frames,
and the site files it serves."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fed_auc.exchange import NodeFailure
from fed_auc.node.setup import NodeSetup
from fed_auc.site import SiteDefinition
from fed_auc.store.run_store import RunStore
from fed_auc.transport.flower import server
from fed_auc.transport.flower.client import frame_content, message_frame
from fed_auc.transport.flower.codec import (
    broadcast_frame,
    frame_evaluation,
    frame_reply,
    pair_tensors,
    tensor_frame,
)
from fed_auc.transport.flower.worker import NodeWorker


# -- the transport -------------------------------------------------------------------------
class FlowerLikeTransport:
    """``FlowerTransport`` without Flower: the same frames, one in-process worker per site."""

    def __init__(
        self, site_files: list[Path], setup: NodeSetup, workers: dict | None = None
    ) -> None:
        """``workers``: the sites' running workers (several runs on the same nodes), else
        one new worker per site file."""
        if workers is None:
            sites = [SiteDefinition.from_toml(path) for path in site_files]
            workers = {site.name: NodeWorker(site) for site in sites}
        self.workers = workers
        self.setup = setup.to_dict()
        self.registrations: dict[str, dict[str, Any]] = {}
        self.summaries: dict[str, dict[str, Any]] = {}
        self.held: dict[str, list[str]] = {}  # content tags each node says it holds
        self.requests: list[tuple[str, int, int]] = []  # (kind, tensors sent, sent as tags)

    @property
    def sites(self) -> list[str]:
        return list(self.registrations)

    def use(self, setup: NodeSetup) -> FlowerLikeTransport:
        self.setup = setup.to_dict()
        return self

    def register(self) -> dict[str, dict[str, Any]]:
        if self.registrations:
            return self.registrations
        request = {"kind": "register", "setup": self.setup}
        answers = {site: self._ask(site, (request, [])) for site in self.workers}
        for site in sorted(answers, key=lambda s: answers[s][0]["registration"]["order"]):
            self.registrations[site] = answers[site][0]["registration"]
            self.summaries[site] = answers[site][0]["summary"]
        return self.registrations

    def train(self, requests):
        memo: dict[int, str] = {}
        return {
            site: self._decode(
                site,
                frame_reply,
                self._ask(site, broadcast_frame(b, self.setup, self.held.get(site, []), memo)),
            )
            for site, b in requests.items()
        }

    def secure(self, step, messages):
        """One step of secure aggregation at each site, as ``FlowerTransport.secure``."""
        out = {}
        for site, message in messages.items():
            header = {"kind": "secure", "setup": self.setup, "step": step, "message": message}
            answer = self._ask(site, (header, []))
            out[site] = answer if isinstance(answer, NodeFailure) else answer[0]["answer"]
        return out

    def evaluate(self, sites, tensors, pooled=True, thresholds=None):
        header = {"kind": "evaluate", "setup": self.setup, "pooled": pooled}
        if thresholds is not None:  # as FlowerTransport.evaluate: bins around the threshold
            header["thresholds"] = list(thresholds)
        memo: dict[int, str] = {}
        return {
            site: self._decode(
                site,
                frame_evaluation,
                self._ask(site, tensor_frame(header, tensors, self.held.get(site, []), memo)),
            )
            for site in sites
        }

    def report(self, sites, request, tensors):
        """An evaluation job's request at each site (``FlowerTransport.report``)."""
        header = {"kind": "report", "setup": self.setup, "request": request.to_dict()}
        memo: dict[int, str] = {}
        out = {}
        for site in sites:
            answer = self._ask(site, tensor_frame(header, tensors, self.held.get(site, []), memo))
            out[site] = answer if isinstance(answer, NodeFailure) else answer[0]["report"]
        return out

    def compare(self, sites, request, tensors):
        """A paired comparison at each site (``FlowerTransport.compare``)."""
        header = {"kind": "compare", "setup": self.setup, "request": request.to_dict()}
        memo: dict[int, str] = {}
        both = pair_tensors(tensors)
        out = {}
        for site in sites:
            answer = self._ask(site, tensor_frame(header, both, self.held.get(site, []), memo))
            out[site] = answer if isinstance(answer, NodeFailure) else answer[0]["comparison"]
        return out

    def end(self, status: str) -> None:
        """Tell every node the run ended, as ``FlowerTransport.end``."""
        header = {"kind": "end", "run_id": self.setup["run_id"], "status": status}
        for site in self.workers:
            self._ask(site, (header, []))

    def _ask(self, site: str, frame):
        """One request as a Flower message's content, answered as ``fed-auc node`` answers it."""
        header, buffers = message_frame(frame_content(*frame))
        index = header.get("index", [])
        self.requests.append((header["kind"], len(index), sum(e[3] == -1 for e in index)))
        try:
            answer = message_frame(frame_content(*self.workers[site].handle(header, buffers)))
        except Exception as exc:  # a Flower error reply
            self.held.pop(site, None)
            return NodeFailure(site, "error", f"{type(exc).__name__}: {exc}")
        self.held[site] = answer[0].get("cached", [])
        return answer

    @staticmethod
    def _decode(site, decode, answer):
        if isinstance(answer, NodeFailure):
            return answer
        return decode(answer)


# -- site files ----------------------------------------------------------------------------
def _png_csv(folder: Path, labels: list[str], rows: int = 30, seed: int = 0) -> Path:
    """A CSV of 16 px PNGs with a split column (train 4 : val 1 : test 1); every label has
    both classes in every split. The first label brightens the centre, the second the top."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(rows):
        block = i // 6
        values = [int(block % 2 == 0), int(block % 3 == 1)][: len(labels)]
        pixels = rng.normal(90, 30, (16, 16))
        pixels[5:11, 5:11] += 60 * values[0]
        if len(values) > 1:
            pixels[:4] += 60 * values[1]
        rel = f"img/{i:03d}.png"
        (folder / "img").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(folder / rel)
        split = ("train", "train", "train", "train", "val", "test")[i % 6]
        lines.append(
            {"Path": rel, **dict(zip(labels, map(str, values), strict=True)), "split": split}
        )
    path = folder / "labels.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(lines[0]))
        writer.writeheader()
        writer.writerows(lines)
    return path


def _site_files(root: Path, sites: list[tuple[str, str]], node: dict[str, str]) -> list[Path]:
    root.mkdir()
    files = []
    for index, (name, spec) in enumerate(sites):
        path = root / f"{name}.toml"
        path.write_text(
            f'name = "{name}"\n\n[data]\nspec = "{spec}"\n\n'
            f'[node]\nstate_dir = "state/{name}"\nindex = {index}\n{node.get(name, "")}'
        )
        files.append(path)
    return files


# -- the two runs --------------------------------------------------------------------------
def _over_worker(options: dict, files: list[Path], runs: Path) -> tuple:
    """The Flower coordinator's ``run_experiment``, its transport swapped for ours."""
    made: list[FlowerLikeTransport] = []

    def transport(grid, setup, settings, log, event, identities=None):
        made.append(FlowerLikeTransport(files, setup))
        return made[-1]

    config = {**options, "transport": "flower", "runs_dir": str(runs)}
    flower = {"expected_sites": len(files), "min_nodes": len(files), "insecure": True}
    flower["pooled_scoring"] = True  # as in-process: pooled AUCs and thresholds
    with RunStore(runs) as store:
        run_id = store.create_run(options.get("algorithm", "codasca"), config, None)
    experiment = {"experiment": config, "flower": flower, "run_id": run_id}
    summary = server.run_experiment(None, experiment, lambda line: None, transport)
    return summary, made[0]
