"""What the image cache's checks cost at hospital scale (``image_cache verify``, issue 36).

Hashing: MB/s of SHA-256 (what the cache records) and of BLAKE2b (the alternative) over a
buffer in memory; then a cache file of N images (100,000 by default) at each image size,
written under ``--data`` and evicted from the page cache (``posix_fadvise DONTNEED``, this
file only), verified by ``fed_auc.data.cache.file_sha256`` from disk, and hashed again with
BLAKE2b from the page cache. Reading: ms per random 32-row batch at the largest size, through
``CachedImages`` (an identity check, then ``os.preadv``) and through the memory map it
replaced. Paths: seconds to resolve and contain N CSV image paths (``fed_auc.data.paths``).
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
from pathlib import Path

import numpy as np

from fed_auc.data.cache import file_sha256
from fed_auc.data.memmap import CachedImages, identity
from fed_auc.data.paths import contained_paths

CHUNK = 1 << 20  # bytes per write and per hash update
BATCH = 32  # rows of a training batch


def hash_rates(megabytes: int, repeats: int = 3) -> dict[str, float]:
    """MB/s (1 MB = 10⁶ bytes) of SHA-256 and BLAKE2b over ``megabytes`` in memory, best of
    ``repeats``."""
    data = np.random.default_rng(0).integers(0, 256, megabytes * 10**6, np.uint8).tobytes()
    rates = {}
    for name in ("sha256", "blake2b"):
        best = min(_hash_seconds(name, [data]) for _ in range(repeats))
        rates[name] = megabytes / best
    return rates


def _hash_seconds(name: str, chunks) -> float:
    digest, start = hashlib.new(name), time.perf_counter()
    for chunk in chunks:
        view = memoryview(chunk)
        for at in range(0, len(view), CHUNK):
            digest.update(view[at : at + CHUNK])
    return time.perf_counter() - start


def _file_chunks(path: Path):
    with open(path, "rb") as f:
        yield from iter(lambda: f.read(CHUNK), b"")


def write_cache_file(path: Path, images: int, size: int) -> None:
    """A file of ``images`` random uint8 S×S rows, flushed to disk, out of the page cache."""
    rng = np.random.default_rng(size)
    block = rng.integers(0, 256, CHUNK, np.uint8).tobytes()
    remaining = images * size * size
    with open(path, "wb") as f:
        while remaining:
            n = min(remaining, CHUNK)
            f.write(block[:n])
            remaining -= n
        f.flush()
        os.fsync(f.fileno())
    _evict(path)


def _evict(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)


def verify_rows(folder: Path, images: int, sizes: list[int]) -> list[dict]:
    """Per image size: the file's size, SHA-256 verification from disk (as ``open`` does)
    and BLAKE2b of the same bytes from the page cache, in seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in sizes:
        path = folder / f"verify-{images}-{size}px.npy"
        write_cache_file(path, images, size)
        start = time.perf_counter()
        file_sha256(path)
        cold = time.perf_counter() - start
        warm = {name: _hash_seconds(name, _file_chunks(path)) for name in ("sha256", "blake2b")}
        rows.append({"size": size, "gb": path.stat().st_size / 1e9, "sha256_disk_s": cold,
                     "sha256_cached_s": warm["sha256"], "blake2b_cached_s": warm["blake2b"],
                     "load": os.getloadavg()[0]})  # fmt: skip
        if size != max(sizes):
            path.unlink()
    return rows


def read_rows(folder: Path, images: int, size: int, batches: int) -> dict[str, float]:
    """Median ms per random ``BATCH``-row batch read by preadv (after the identity check)
    and by the per-read memory map it replaced, alternating, from the page cache."""
    path = folder / f"verify-{images}-{size}px.npy"
    cached = CachedImages(path, 0, images, size, identity(os.stat(path)))
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {"preadv": [], "memmap": []}
    for _ in range(batches):
        rows = np.sort(rng.choice(images, BATCH, replace=False))
        start = time.perf_counter()
        cached[rows].read_uint8()
        times["preadv"].append(time.perf_counter() - start)
        start = time.perf_counter()
        mapped = np.memmap(path, np.uint8, "r", shape=(images, 1, size, size))
        np.array(mapped[rows])
        mapped._mmap.close()
        times["memmap"].append(time.perf_counter() - start)
    path.unlink()
    return {name: 1000 * statistics.median(values) for name, values in times.items()}


def path_seconds(folder: Path, images: int, distinct: int = 1000) -> float:
    """Seconds to contain ``images`` CSV paths naming ``distinct`` files in a sub-folder."""
    data = folder / "paths"
    (data / "img").mkdir(parents=True, exist_ok=True)
    for i in range(distinct):
        (data / "img" / f"{i}.png").touch()
    names = [f"img/{i % distinct}.png" for i in range(images)]
    start = time.perf_counter()
    contained_paths(data / "labels.csv", data, names, list(range(2, images + 2)), False)
    return time.perf_counter() - start


def measure(folder: Path, images: int, sizes: list[int], megabytes: int, batches: int) -> dict:
    """Every measurement of this module, for one table."""
    return {
        "images": images,
        "rates": hash_rates(megabytes),
        "verify": verify_rows(folder, images, sizes),
        "read": read_rows(folder, images, max(sizes), batches),
        "paths_s": path_seconds(folder, images),
    }


def markdown(result: dict, head: list[str]) -> str:
    """The table of ``measure``'s result below ``head`` (provenance line and column header)."""
    rates, n = result["rates"], result["images"]
    lines = head
    for r in result["verify"]:
        lines.append(
            f"| {n:,} | {r['size']} | {r['gb']:.2f} | {r['sha256_disk_s']:.1f} | "
            f"{r['sha256_cached_s']:.1f} | {r['blake2b_cached_s']:.1f} | {r['load']:.1f} |"
        )
    lines.append(
        f"\nIn memory: SHA-256 {rates['sha256']:.0f} MB/s, BLAKE2b {rates['blake2b']:.0f} MB/s. "
        f"A random {BATCH}-row batch at {max(r['size'] for r in result['verify'])} px: "
        f"{result['read']['preadv']:.2f} ms by preadv with the identity check, "
        f"{result['read']['memmap']:.2f} ms by a memory map (median). "
        f"Containing {n:,} CSV image paths: {result['paths_s']:.2f} s."
    )
    return "\n".join(lines) + "\n"


COLUMNS = [
    "N images", "px", "cache file (GB)", "SHA-256 verify from disk (s)",
    "SHA-256 from page cache (s)", "BLAKE2b from page cache (s)", "load (1 min)",
]  # fmt: skip
