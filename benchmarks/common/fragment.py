"""The Markdown fragment a benchmark writes with ``--markdown PATH``.

``benchmarks.run_all`` splices each fragment into BENCHMARKS.md, so every table carries the
exact command that produced it, the machine and the seeds in a line above it; the prose that
interprets the numbers stays hand-written around the fragment.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common.machine import describe


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as it was run, less ``--markdown PATH`` (where the fragment went)."""
    argv = list(sys.argv if argv is None else argv)
    kept, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
        elif arg == "--markdown":
            skip = True
        elif not arg.startswith("--markdown="):
            kept.append(arg)
    return shlex.join(["python", "-m", module_name(argv[0]), *kept])


def module_name(script: str) -> str:
    """``benchmarks.systems.overhead`` for ``.../benchmarks/systems/overhead.py``: benchmarks
    run as modules from the repository root."""
    parts = Path(script).with_suffix("").parts
    if parts and parts[-1] == "__main__":  # ``python -m benchmarks.reliability``: a package
        parts = parts[:-1]
    if "benchmarks" in parts:
        last = len(parts) - 1 - parts[::-1].index("benchmarks")
        return ".".join(parts[last:])
    return f"benchmarks.{Path(script).stem}"


def provenance(seeds: str, elapsed_s: float, settings: str = "") -> str:
    """The line above a table: command, wall time, machine, seeds and the settings it used."""
    line = f"`{command_line()}` ({elapsed_s:.0f} s; {describe()}; seeds {seeds})"
    return f"{line}. {settings}" if settings else f"{line}."


def emit(text: str, markdown: Path | None) -> None:
    """Print the fragment and, with ``--markdown``, write it to that file."""
    print(text)
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(text.rstrip("\n") + "\n")
