"""Fault injection → RELIABILITY.md: crashes, failing nodes, hostile replies, bad inputs, DP cost.

    python -m benchmarks.reliability [--kills 5] [--out RELIABILITY.md]
    python -m benchmarks.reliability --quick --markdown benchmarks/results/reliability.md

``--quick``: one kill, one flaky run, every hostile kind, 3 rounds per run. With ``--quick`` or
``--markdown`` it writes RELIABILITY.md only if ``--out`` says so (run_all.py splices the
fragment into RELIABILITY.md between its markers).

Every number in the table comes from what this script ran: runs killed with SIGKILL at a
random moment and resumed (compared with the uninterrupted run of the same seed), runs with
nodes that fail at random, every kind of hostile reply, a corpus of bad inputs (each must get
an error naming what and where), and the AUC cost of client-side DP.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from benchmarks.common.fragment import command_line, emit
from benchmarks.common.machine import describe
from fed_auc.data.csv_images import load_csv_images
from fed_auc.data.medmnist import load_medmnist
from fed_auc.data.synthetic import DEFAULT_PROFILES
from fed_auc.exchange import Reply
from fed_auc.experiment.config import ExperimentConfig
from fed_auc.io import CorruptState, load_state, load_torch, save_state
from fed_auc.node.node import Node
from fed_auc.simulation import run_simulation
from fed_auc.store.run_store import RunStore, StoreError

DP_ROUNDS = 15
SMALL = {"sites": 3, "rounds": 6, "local_steps": 2, "seed": 11, "data_scale": 0.4}
QUICK_ROUNDS = 3  # --quick: rounds of SMALL and of the DP runs
BAD = DEFAULT_PROFILES[1].name


# -- crash and resume ---------------------------------------------------------------------
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


# -- failing nodes and hostile replies -------------------------------------------------------
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


# -- bad inputs ---------------------------------------------------------------------------------
def bad_inputs(workdir: Path) -> dict[str, list[int]]:
    """Kind → [tried, clear]. Clear = the expected error type, naming the file/field/value."""
    results: dict[str, list[int]] = {}

    def expect(kind: str, action: Callable[[], object], errors: tuple, *needles: str) -> None:
        tried_clear = results.setdefault(kind, [0, 0])
        tried_clear[0] += 1
        try:
            action()
        except errors as exc:
            tried_clear[1] += all(n in str(exc) for n in needles)
        except Exception as exc:  # the wrong kind of error counts as unclear
            print(f"{kind}: unexpected {type(exc).__name__}: {exc}", file=sys.stderr)

    config_cases = [
        ({"colour": "red"}, "colour"),
        ({"sites": "four"}, "sites"),
        ({"rounds": 0}, "rounds"),
        ({"lr": -1.0}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"participation": 1.5}, "participation"),
        ({"algorithm": "sgd"}, "algorithm"),
        ({"local_steps": True}, "local_steps"),
        ({"backend_options": {"server_lr": "fast"}}, "server_lr"),
        ({"local_steps_range": "3-20"}, "local_steps_range"),
        ({"dp_noise": 1.0}, "dp_noise"),
        ({"max_update_norm": 0}, "max_update_norm"),
    ]
    for values, field in config_cases:
        expect("config", lambda v=values: ExperimentConfig(**v), (ValueError, TypeError), field)

    toml = workdir / "bad.toml"
    for text in ("rounds = [", "rounds = 'many'", "colour = 1"):
        toml.write_text(text)
        expect(
            "config file",
            lambda: __import__("fed_auc.cli").cli.main(["simulate", "--config", str(toml)]),
            (SystemExit,),
            str(toml),
        )

    store_dir = workdir / "notsqlite"
    store_dir.mkdir()
    (store_dir / "fed_auc.sqlite").write_bytes(b"\x00garbage" * 1000)
    expect("store file", lambda: RunStore(store_dir), (StoreError,), str(store_dir))

    state = workdir / "local_state.pt"
    for cut in (0.5, 0.99):
        save_state({"c": torch.arange(10_000.0)}, state)
        data = state.read_bytes()
        state.write_bytes(data[: int(len(data) * cut)])
        expect("state file (torn)", lambda: load_state(state), (CorruptState,), str(state))
    save_state({"c": torch.arange(10_000.0)}, state)
    data = bytearray(state.read_bytes())
    data[-3] ^= 1
    state.write_bytes(bytes(data))
    expect("state file (altered)", lambda: load_state(state), (CorruptState,), str(state))

    bad_data_files(workdir, expect)
    return results


def bad_data_files(workdir: Path, expect: Callable) -> None:
    """Broken images, CSVs and npz files, written here; each error must name file and place."""
    data = workdir / "data"
    data.mkdir()
    for i in range(4):
        Image.fromarray(np.full((8, 8), 40 * i, dtype=np.uint8)).save(data / f"ok{i}.png")
    (data / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    (data / "text.jpg").write_text("a note, not a JPEG")
    (data / "empty.dcm").write_bytes(b"")
    deep = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64)  # 16-bit, as hospitals export
    for suffix in ("png", "tif"):
        Image.fromarray(deep).save(data / f"deep.{suffix}")
        raw = (data / f"deep.{suffix}").read_bytes()
        (data / f"cut16.{suffix}").write_bytes(raw[: len(raw) // 2])
    _dicom(data / "deep.dcm", deep)
    raw = (data / "deep.dcm").read_bytes()
    (data / "cut.dcm").write_bytes(raw[: len(raw) // 2])
    _dicom(data / "window0.dcm", deep, WindowCenter=100, WindowWidth=0)
    csv_cases = {
        "missing image": ("path,label\nok0.png,1\ngone.png,0\n", "gone.png"),
        "corrupt image": ("path,label\nok0.png,1\ncorrupt.png,0\n", "corrupt.png"),
        "not an image": ("path,label\nok0.png,1\ntext.jpg,0\n", "text.jpg"),
        "empty DICOM": ("path,label\nok0.png,1\nempty.dcm,0\n", "empty.dcm"),
        "truncated 16-bit PNG image": ("path,label\nok0.png,1\ncut16.png,0\n", "cut16.png"),
        "truncated 16-bit TIFF image": ("path,label\nok0.png,1\ncut16.tif,0\n", "cut16.tif"),
        "truncated DICOM": ("path,label\nok0.png,1\ncut.dcm,0\n", "cut.dcm"),
        "DICOM window width 0": ("path,label\nok0.png,1\nwindow0.dcm,0\n", "WindowWidth"),
        "label 2": ("path,label\nok0.png,1\nok1.png,2\n", "'2'"),
        "label 'yes'": ("path,label\nok0.png,yes\nok1.png,0\n", "'yes'"),
        "no label column": ("path,finding\nok0.png,1\n", "label"),
        "no path column": ("file,label\nok0.png,1\n", "image path column"),
        "empty CSV": ("", "data"),
        "ragged rows": ('path,label\nok0.png,1,3,"\n', "data"),
    }
    for name, (body, needle) in csv_cases.items():
        path = data / f"{name.replace(' ', '_').replace(chr(39), '')}.csv"
        path.write_text(body)
        kind = "image file" if "image" in name or "DICOM" in name else "CSV"
        expect(
            kind,
            lambda p=path: load_csv_images(p, image_size=8),
            (ValueError,),
            path.name,
            needle,
        )

    good = {
        f"{split}_{part}": (
            np.zeros((4, 8, 8), np.uint8) if part == "images" else np.array([[0], [1], [0], [1]])
        )
        for split in ("train", "val", "test")
        for part in ("images", "labels")
    }
    npz = data / "ok.npz"
    np.savez(npz, **good)
    raw = npz.read_bytes()
    truncated = data / "truncated.npz"
    truncated.write_bytes(raw[: len(raw) // 2])
    expect("npz", lambda: load_medmnist(truncated), (ValueError,), "truncated.npz")
    missing = data / "missing.npz"
    np.savez(missing, **{k: v for k, v in good.items() if not k.startswith("test")})
    expect("npz", lambda: load_medmnist(missing), (ValueError,), "missing.npz", "test_images")
    labels = data / "labels.npz"
    np.savez(labels, **{**good, "val_labels": np.array([[0], [7], [0], [1]])})
    expect("npz", lambda: load_medmnist(labels), (ValueError,), "labels.npz", "7")


def _dicom(path: Path, pixels: np.ndarray, **tags: object) -> None:
    """A minimal 16-bit grayscale DICOM file with extra `tags`."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID = SecondaryCaptureImageStorage
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID = generate_uid()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.Rows, ds.Columns = pixels.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated = ds.BitsStored = 16
    ds.HighBit, ds.PixelRepresentation = 15, 0
    ds.PixelData = pixels.astype(np.uint16).tobytes()
    for name, value in tags.items():
        setattr(ds, name, value)
    ds.save_as(path, enforce_file_format=True)


# -- privacy cost ---------------------------------------------------------------------------------
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


# -- report ----------------------------------------------------------------------------------------
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
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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


if __name__ == "__main__":
    main()
