"""How many CPU threads torch should use: the cores other processes leave free.

On a shared machine, two OpenMP threads on two busy cores are far slower than one: each
parallel region waits at a barrier for a thread the OS has descheduled (measured here under a
load average of ~5 on 2 cores: DenseNet121 @ 32 px, batch 128, 18 s per step with 2 threads vs
1.6 s with 1; see benchmarks/systems/throughput.py). ``--threads auto`` (the CLI's default)
therefore takes the cores the 1-minute load average says are idle, at least one.
"""

from __future__ import annotations

import os

import torch


def auto_threads(cpus: int | None = None, load: float | None = None) -> int:
    """Idle cores: CPU count minus the 1-minute load average (rounded), within [1, cpus]."""
    cpus = cpus if cpus is not None else len(os.sched_getaffinity(0))
    load = load if load is not None else os.getloadavg()[0]
    return max(1, min(cpus, cpus - round(load)))


def parse_threads(value: str) -> int | None:
    """``auto`` → None (decide at start), else a positive integer; argparse type."""
    if value == "auto":
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"--threads must be 'auto' or an integer >= 1, got {value!r}")
    return int(value)


def apply_threads(requested: int | None) -> int:
    """Set torch's thread count (``None`` = auto, unless OMP_NUM_THREADS already says)."""
    if requested is None and os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()  # the operator chose; torch read it at import
    threads = requested if requested is not None else auto_threads()
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # subprocesses (Flower's) follow suit
    return threads
