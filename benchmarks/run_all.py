"""Regenerate every table in BENCHMARKS.md (and RELIABILITY.md) from the benchmark scripts.

Each script is run from the repository root as ``python -m benchmarks.<group>.<script>
[ARGS] [--quick] --markdown benchmarks/results/<name>.md``; its fragment (tables, the exact
command, the machine, the seeds) then replaces the text between ``<!-- results:<name> -->`` and
``<!-- /results:<name> -->`` in the document that holds those markers. The prose around the
markers is written by people and stays. A script that fails is reported and its old
fragment kept, so one broken benchmark never erases the others' results.

    python -m benchmarks.run_all --quick          # every table, small settings (< 20 min)
    python -m benchmarks.run_all                  # the larger settings (hours)
    python -m benchmarks.run_all --quick --only scale communication
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common.paths import BREASTMNIST, RESULTS, ROOT

DOCUMENTS = (ROOT / "BENCHMARKS.md", ROOT / "RELIABILITY.md")


@dataclass(frozen=True)
class Benchmark:
    name: str
    module: str  # run as ``python -m MODULE`` from the repository root
    args: tuple[str, ...] = ()
    needs: Path | None = None  # a data file outside the repository; skipped when absent


BENCHMARKS = (
    Benchmark("overhead", "benchmarks.systems.overhead"),
    Benchmark("positive_floor", "benchmarks.rare_positives.positive_floor"),
    Benchmark("dp_epsilon", "benchmarks.claims.dp_epsilon"),
    Benchmark("synthetic_difficulty", "benchmarks.systems.synthetic_difficulty"),
    Benchmark("compare_backends", "benchmarks.claims.compare_backends"),
    Benchmark("communication", "benchmarks.claims.communication"),
    Benchmark("scale", "benchmarks.systems.scale"),
    Benchmark("libauc_compare", "benchmarks.anchors.libauc_compare"),
    Benchmark("throughput", "benchmarks.systems.throughput"),
    Benchmark("flower_overhead", "benchmarks.systems.flower_overhead"),
    Benchmark("secure_aggregation", "benchmarks.systems.secure_aggregation"),
    Benchmark(
        "partial_and_personal",
        "benchmarks.claims.partial_and_personal",
        ("memory", "partial", "personal"),
    ),
    Benchmark("breastmnist", "benchmarks.anchors.breastmnist", needs=BREASTMNIST),
    Benchmark("libauc_breastmnist", "benchmarks.anchors.libauc_breastmnist", needs=BREASTMNIST),
    Benchmark("auc_vs_ce", "benchmarks.rare_positives.auc_vs_ce"),
    Benchmark("pretrained_start", "benchmarks.claims.pretrained_start", needs=BREASTMNIST),
    Benchmark(
        "dp_epsilon_breastmnist",
        "benchmarks.claims.dp_epsilon",
        ("--federation", "breastmnist"),
        BREASTMNIST,
    ),
    Benchmark(
        "compression",
        "benchmarks.systems.compression",
        ("--npz", str(BREASTMNIST), "--seeds", "0,1,2", "--rounds", "12"),
        BREASTMNIST,
    ),
    Benchmark(
        "compression_secure",
        "benchmarks.systems.compression",
        ("--secure", "--seeds", "0,1,2", "--rounds", "12"),
    ),
    Benchmark("reliability", "benchmarks.reliability"),
    Benchmark("dashboard_pages", "benchmarks.systems.dashboard_pages"),
)


def splice(document: str, name: str, fragment: str) -> str:
    """``document`` with the text between the markers of ``name`` replaced by ``fragment``."""
    pattern = re.compile(
        rf"(<!-- results:{re.escape(name)} -->\n).*?(<!-- /results:{re.escape(name)} -->)",
        re.DOTALL,
    )
    if not pattern.search(document):
        raise KeyError(f"no <!-- results:{name} --> ... <!-- /results:{name} --> markers")
    return pattern.sub(lambda m: m.group(1) + fragment.rstrip("\n") + "\n" + m.group(2), document)


def place(name: str, fragment: str, documents: tuple[Path, ...] = DOCUMENTS) -> Path:
    """Write ``fragment`` into whichever document has the markers of ``name``."""
    for path in documents:
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        if f"<!-- results:{name} -->" in text:
            path.write_text(splice(text, name, fragment), encoding="utf-8")
            return path
    raise KeyError(f"no document among {[p.name for p in documents]} has markers for {name!r}")


def run(benchmark: Benchmark, quick: bool) -> tuple[str, float]:
    """Run one script; its fragment lands in results/<name>.md and in its document."""
    if benchmark.needs is not None and not benchmark.needs.exists():
        return f"skipped: {benchmark.needs} not found", 0.0
    out = RESULTS / f"{benchmark.name}.md"
    command = [sys.executable, "-m", benchmark.module, *benchmark.args]
    command += ["--quick"] if quick else []
    command += ["--markdown", str(out)]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return f"FAILED (exit {done.returncode}): " + " / ".join(tail), seconds
    document = place(benchmark.name, out.read_text(encoding="utf-8"))
    return f"updated {document.name}", seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small settings, < 20 min in all")
    names = [b.name for b in BENCHMARKS]
    parser.add_argument("--only", nargs="+", choices=names, help="run just these")
    parser.add_argument("--skip", nargs="+", choices=names, default=[], help="leave these out")
    args = parser.parse_args()
    chosen = [b for b in BENCHMARKS if (not args.only or b.name in args.only)]
    chosen = [b for b in chosen if b.name not in args.skip]
    RESULTS.mkdir(parents=True, exist_ok=True)
    total, failed = 0.0, []
    for benchmark in chosen:
        print(f"{benchmark.name} ...", end=" ", flush=True)
        outcome, seconds = run(benchmark, args.quick)
        total += seconds
        print(f"{outcome} ({seconds:.0f} s)", flush=True)
        if outcome.startswith("FAILED"):
            failed.append(benchmark.name)
    print(f"{len(chosen)} benchmarks in {total / 60:.1f} min; failed: {failed or 'none'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
