"""One line that says where a benchmark ran: every table in BENCHMARKS.md carries it."""

from __future__ import annotations

import os
import platform


def describe() -> str:
    """CPU model and count, memory, torch build and threads, and the load when measured."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if "model name" in line)
    except (OSError, StopIteration):
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{cpu}, {os.cpu_count()} cores, {memory:.0f} GiB; Python {platform.python_version()}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; load average {load}"
    )
