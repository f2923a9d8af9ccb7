"""Dashboard page loads on a big run: 64 sites, 200 rounds (target: every page < 2 s).

A store is filled as the coordinator fills it: every site scored every round with its ROC
points (≤ 61 here: 60 test images), drift and cosine, steps, bytes; one site drops out
after round 50; the export (round 180) scored with binned counts at its threshold. Each page
is rendered with Streamlit's AppTest in a fresh process (the script's own time: queries,
tables, chart specs; the browser's drawing is not included). ``cold``: the first visit of
each page, starting with the Overview with empty caches (it loads the run), in a process
that has already rendered every page once over an empty runs directory (as a running server
has imported its modules); ``warm``: the second visit. The baseline is the dashboard before issue 20
(``git show BASE:app``), on the same store in the same way, side by side.

    python -m benchmarks.systems.dashboard_pages --quick
    python -m benchmarks.systems.dashboard_pages --markdown benchmarks/results/dashboard_pages.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import numpy as np

from app.pages import ROUND_PAGES
from benchmarks.common.fragment import emit, provenance
from benchmarks.common.paths import ROOT

PAGES = tuple(p.key for p in ROUND_PAGES)  # the pages that draw a big run's rounds
TARGET_S = 2.0
TEST_N = 60
THRESHOLD = 0.4137


def fill(runs_dir: Path, sites: int, rounds: int, seed: int = 0) -> str:
    """A completed run of ``sites`` sites and ``rounds`` rounds, as a federation writes it:
    the last site drops out after a quarter of the rounds; round 0.9 × rounds is exported."""
    from fed_auc.metrics.operating_point import default_edges, score_bins
    from fed_auc.metrics.roc import roc_points
    from fed_auc.store.records import RoundRecord, SiteRound
    from fed_auc.store.run_store import RunStore

    rng = np.random.default_rng(seed)
    names = [f"site_{i:02d}" for i in range(sites)]
    dropped, drop_after, exported_round = names[-1], rounds // 4, int(0.9 * rounds)
    prevalence = rng.uniform(0.1, 0.5, sites)

    def split(i: int, round_: int) -> tuple[np.ndarray, np.ndarray]:
        labels = (rng.random(TEST_N) < prevalence[i]).astype(float)
        signal = 0.3 * min(round_, 100) / 100
        return labels, np.clip(0.4 + signal * labels + rng.normal(0, 0.15, TEST_N), 0, 1)

    with RunStore(runs_dir) as store:
        run_id = store.create_run(
            "codasca", {"rounds": rounds, "sites": sites, "seed": seed}, run_id="big"
        )
        store.record_sites(
            run_id,
            {
                name: {
                    "label_names": ["finding"],
                    "source": "synthetic",
                    "train": {
                        "n": 200,
                        "positives": [int(200 * prevalence[i])],
                        "intensity_mean": float(rng.random()),
                        "intensity_std": float(rng.random()),
                    },
                }  # fmt: skip
                for i, name in enumerate(names)
            },
        )
        for round_ in range(rounds + 1):
            rows = []
            for i, name in enumerate(names):
                if name == dropped and round_ > drop_after:
                    rows.append(SiteRound(name, "dropped"))
                    continue
                labels, scores = split(i, round_)
                roc = roc_points(labels, scores)
                auc = float(np.trapezoid(roc["tpr"], roc["fpr"])) if roc["fpr"] else None
                rows.append(
                    SiteRound(
                        name,
                        "initial" if round_ == 0 else "completed",
                        steps=8 + i % 4 if round_ else None,
                        n=200,
                        positives=[int(200 * prevalence[i])],
                        auc=auc,
                        auc_lo=None if auc is None else auc - 0.1,
                        auc_hi=None if auc is None else min(1, auc + 0.1),
                        n_test=TEST_N,
                        test_positives=[int(labels.sum())],
                        drift=float(rng.random()),
                        cosine=float(rng.random()),
                        update_norm=1.0,
                        bytes_down=10**6,
                        bytes_up=10**6,
                        metrics={"roc": [roc], "undefined": []},
                    )  # fmt: skip
                )
            defined = [r.auc for r in rows if r.auc is not None]
            store.record_round(
                run_id,
                RoundRecord(round_, global_auc=float(np.mean(defined)),
                            worst_site_auc=min(defined), mean_site_auc=float(np.mean(defined)),
                            bytes_down=sites * 10**6, bytes_up=sites * 10**6, sites=rows),
            )  # fmt: skip
        exported = {}
        for i, name in enumerate(names):
            if name == dropped:
                continue
            labels, scores = split(i, exported_round)
            bins = score_bins(labels, scores, default_edges([THRESHOLD]))
            exported[name] = [
                {"n": TEST_N, "positives": int(labels.sum()), "auc": 0.7, "auc_lo": 0.6,
                 "auc_hi": 0.8, "note": "", "threshold": THRESHOLD, "bins": bins.to_dict()}
            ]  # fmt: skip
        store.record_model_evaluation(run_id, "exported", "test", exported)
        store.finish_run(
            run_id,
            "completed",
            {"selected_round": exported_round, "threshold": [THRESHOLD], "exported_auc": 0.7},
        )
    return run_id


RENDER = """
import json, os, time
from streamlit.testing.v1 import AppTest
os.environ["FED_AUC_RUNS_DIR"] = {runs!r} + "-empty"  # a server already up: modules imported
for page in {pages!r}:
    if os.path.exists(os.path.join({root!r}, "app", "views", page + ".py")):
        AppTest.from_file({script!r}, default_timeout=120).run().switch_page(
            "views/" + page + ".py").run()
os.environ["FED_AUC_RUNS_DIR"] = {runs!r}
at = AppTest.from_file({script!r}, default_timeout=120)
out = {{}}
start = time.perf_counter(); at.run(); out["cold:overview"] = time.perf_counter() - start
assert not at.exception, [e.value for e in at.exception]
for visit in ("cold", "warm"):
    for page in {pages!r}:
        if visit + ":" + page in out:
            continue
        if not os.path.exists(os.path.join({root!r}, "app", "views", page + ".py")):
            continue
        start = time.perf_counter()
        at.switch_page("views/" + page + ".py").run()
        elapsed = time.perf_counter() - start
        assert not at.exception, (page, [e.value for e in at.exception])
        out[visit + ":" + page] = elapsed
print(json.dumps(out))
"""


def render_times(root: Path, runs: Path, run_id: str) -> dict[str, float]:
    """Every page of the app under ``root`` in a fresh process (one torch/pandas import)."""
    code = RENDER.format(root=str(root), runs=str(runs), run_id=run_id, pages=PAGES,
                         script=str(root / "app" / "streamlit_app.py"))  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # run in ``root``: ``app`` and ``fed_auc`` import from that tree (``-c`` puts the cwd first)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=root, check=False, timeout=1800)  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"rendering {root} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def baseline_tree(base: str, into: Path) -> Path:
    """``app/`` of git revision ``base`` (the dashboard before this change) beside this tree's
    ``fed_auc`` (the store format is the same)."""
    archive = subprocess.run(["git", "archive", base, "app"], cwd=ROOT, capture_output=True,
                             check=True).stdout  # fmt: skip
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    (into / "fed_auc").symlink_to(ROOT / "fed_auc")
    return into


def table(new: dict[str, float], old: dict[str, float]) -> str:
    lines = [
        "| page | cold (s) | warm (s) | baseline cold (s) | baseline warm (s) | cold / baseline |",
        "|---|---|---|---|---|---|",
    ]
    for page in PAGES:
        cold, warm = new.get(f"cold:{page}"), new.get(f"warm:{page}")
        base_cold, base_warm = old.get(f"cold:{page}"), old.get(f"warm:{page}")
        ratio = f"{cold / base_cold:.2f}" if cold and base_cold else "—"
        lines.append(
            f"| {page} | {cold:.2f} | {warm:.2f} | "
            + (f"{base_cold:.2f} | {base_warm:.2f}" if base_cold else "— (no such page) | —")
            + f" | {ratio} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--base", default="2d23c0d", help="git revision of the baseline app")
    parser.add_argument("--quick", action="store_true", help="16 sites, 40 rounds")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.sites, args.rounds = 16, 40
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        fill_start = time.perf_counter()
        run_id = fill(runs, args.sites, args.rounds)
        fill_s = time.perf_counter() - fill_start
        size_mb = (runs / "fed_auc.sqlite").stat().st_size / 1e6
        new = render_times(ROOT, runs, run_id)
        old = render_times(baseline_tree(args.base, Path(tmp) / "base"), runs, run_id)
    slowest = max(v for k, v in new.items() if k.startswith("cold:"))
    load = os.getloadavg()
    text = "\n".join(
        [
            provenance(
                "0",
                time.perf_counter() - started,
                f"{args.sites} sites, {args.rounds} rounds, store {size_mb:.0f} MB (filled in "
                f"{fill_s:.0f} s); baseline app `{args.base}`; load average "
                f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}.",
            ),
            "",
            table(new, old),
            "",
            f"Slowest page, cold: {slowest:.2f} s "
            f"({'under' if slowest < TARGET_S else 'OVER'} the {TARGET_S:.0f} s target).",
        ]
    )
    emit(text, args.markdown)


if __name__ == "__main__":
    main()
