"""A site's images, decoded once into a uint8 file in its state directory and read from there.

Decoding a PNG/DICOM and resizing it costs milliseconds; holding every image as float32 costs
4·S² bytes each (0.65 MB per chest X-ray at 224 px with the decoder's own copies), so a node
of 35,000 images filled a 24 GB machine. The cache decodes each image once, at the
experiment's image size, into ``images-<key>.npy`` (uint8, one row per image, 1/4 of float32
and never in memory all at once); ``fed_auc.data.memmap`` reads the rows a batch needs.
Pixel values are the decoder's [0, 1] floats rounded to multiples of 1/255.

The key. A cache is valid for exactly one decoding: the source file's content (SHA-256 of the
CSV's or the .npz's bytes, which holds the label cells), each image file's size and
modification time (stat: hashing 100,000 X-rays' bytes at every start would read the whole
archive again; an image rewritten in place keeps neither its size nor its mtime), and every
setting that changes what is read or how (image size, aspect, label columns, uncertain and
positive-label policy, frontal-only, the site's rows, skipping unreadable files). Any change
gives another key, and the cache is rebuilt.

Atomic. The images go to a ``.partial`` file, which is flushed and renamed; then the manifest
(``manifest.json``, also written to a temporary name and renamed) names the key, the file and
its size. The manifest is the completeness marker: a build that crashed leaves the old
manifest (another key: rebuilt) or none, and an images file of the wrong size is torn (rebuilt).
A manifest of another site or another source file is refused: one state directory, one site.

Verified. The writer hashes every byte it writes (SHA-256, no second pass) and the manifest
records the digest; ``open`` reads the whole file again and compares before any round uses
it (100,000 images: under 1 s at 28 px, about 30 s at 224 px, 5 GB, from disk on a busy
2-core machine; ``benchmarks/systems/image_cache.py verify``). A file whose bytes
changed since its build is rebuilt from the source images, with a warning naming it; a file
changed while a node runs is refused at its next read (``fed_auc.data.memmap``). The folder
is the node user's only (0700, files 0600): the images are patients' images.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fed_auc.data.memmap import CachedImages, identity

CACHE_FOLDER = "image_cache"  # under the site's state directory
MANIFEST = "manifest.json"
FORMAT = 2  # 2: the manifest holds the images file's SHA-256; private file modes
FOLDER_MODE, FILE_MODE = 0o700, 0o600


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def stat_digest(paths: Iterable[Path]) -> str:
    """SHA-256 over each file's path, size and modification time (``missing`` if absent)."""
    digest = hashlib.sha256()
    for path in paths:
        try:
            found = os.stat(path)
            digest.update(f"{path}\0{found.st_size}\0{found.st_mtime_ns}\n".encode())
        except OSError:
            digest.update(f"{path}\0missing\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class ImageCache:
    """The cache of site ``owner``'s images from ``source`` in ``folder``."""

    folder: Path
    owner: str

    def key(self, source: str, settings: dict[str, Any]) -> str:
        """The cache's key: the source, its content digests and every reading setting."""
        text = json.dumps({"format": FORMAT, "source": source, **settings}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def open(self, source: str, key: str) -> tuple[CachedImages, dict[str, Any]] | None:
        """The complete cache of ``key`` and what its build recorded, or None (absent, stale
        or torn: build it). A cache of another site or source is refused."""
        manifest = self._manifest()
        if manifest is None:
            return None
        if manifest.get("owner") != self.owner or manifest.get("source") != source:
            raise ValueError(
                f"image cache {self.folder} holds site {manifest.get('owner')!r}'s images of "
                f"{manifest.get('source')}, not site {self.owner!r}'s of {source}: give each "
                f"site its own state_dir, or delete {self.folder} to rebuild it"
            )
        if manifest.get("format") != FORMAT or manifest.get("key") != key:
            return None
        path = self.folder / manifest["file"]
        expected = manifest["offset"] + manifest["rows"] * manifest["size"] ** 2
        if not path.is_file() or path.stat().st_size != expected:
            return None  # torn or tampered with: rebuilt
        self._private(path)
        found = identity(os.stat(path))  # before hashing: a change during it shows at a read
        if file_sha256(path) != manifest.get("sha256"):
            warnings.warn(
                f"image cache file {path} is not the file its build recorded (SHA-256 differs: "
                "changed on disk since): rebuilding it from the source images",
                stacklevel=3,
            )
            return None
        count, size = manifest["count"], manifest["size"]
        return CachedImages(path, manifest["offset"], count, size, found), manifest["extra"]

    def writer(self, source: str, key: str, rows: int, size: int) -> CacheWriter:
        """A new build of at most ``rows`` images of ``size`` px (stale builds are removed)."""
        self.folder.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
        self._private(self.folder)
        for old in self.folder.glob("images-*.partial-*"):
            if not _alive(old.name.rsplit("-", 1)[1]):
                old.unlink(missing_ok=True)  # left by a build that crashed
        return CacheWriter(self, source, key, rows, size)

    def _private(self, path: Path) -> None:
        """The folder (0700) and ``path`` (0700 or 0600) readable by the node's user only;
        a cache built before the modes were set is narrowed here."""
        for each in {self.folder, path}:
            mode = FOLDER_MODE if each.is_dir() else FILE_MODE
            if stat.S_IMODE(each.stat().st_mode) != mode:
                os.chmod(each, mode)

    def _manifest(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.folder / MANIFEST).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None  # unreadable: a build did not finish writing it; rebuilt

    def _commit(self, manifest: dict[str, Any]) -> None:
        temporary = self.folder / f"{MANIFEST}.partial-{os.getpid()}"
        with _private_file(temporary, "w") as f:
            json.dump(manifest, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.folder / MANIFEST)
        for other in self.folder.glob("images-*.npy"):
            if other.name != manifest["file"]:
                other.unlink(missing_ok=True)


class CacheWriter:
    """Writes a cache's images one at a time, as plain file writes (the page cache, not this
    process, holds what was written), hashing each byte written, then commits it."""

    def __init__(self, cache: ImageCache, source: str, key: str, rows: int, size: int) -> None:
        self.cache, self.source, self.key, self.rows, self.size = cache, source, key, rows, size
        self.file = f"images-{key[:16]}.npy"
        self._path = cache.folder / f"{self.file}.partial-{os.getpid()}"
        self._out = _private_file(self._path, "wb")
        self._sha256 = hashlib.sha256()
        header = io.BytesIO()
        shape = (rows, 1, size, size)
        np.lib.format.write_array_header_1_0(
            header, {"descr": "|u1", "fortran_order": False, "shape": shape}
        )
        self._write(header.getvalue())
        self.offset = self._out.tell()
        self.count = 0

    def _write(self, data: bytes) -> None:
        self._out.write(data)
        self._sha256.update(data)

    def put(self, image: torch.Tensor) -> None:
        """One float image (1, S, S) in [0, 1]."""
        if self.count == self.rows:
            raise ValueError(f"image cache {self.cache.folder}: more than {self.rows} images")
        pixels = image.mul(255.0).round_().clamp_(0, 255).to(torch.uint8).numpy()
        self._write(pixels.tobytes())
        self.count += 1

    def commit(self, extra: dict[str, Any]) -> tuple[CachedImages, dict[str, Any]]:
        """Finish the file (unused rows zero), rename it, then write the manifest."""
        self._write(bytes((self.rows - self.count) * self.size**2))
        self._out.flush()
        os.fsync(self._out.fileno())
        self._out.close()
        final = self.cache.folder / self.file
        os.replace(self._path, final)
        found = identity(os.stat(final))
        self.cache._commit(
            {
                "format": FORMAT,
                "owner": self.cache.owner,
                "source": self.source,
                "key": self.key,
                "file": self.file,
                "offset": self.offset,
                "rows": self.rows,
                "count": self.count,
                "size": self.size,
                "sha256": self._sha256.hexdigest(),
                "extra": extra,
            }
        )
        return CachedImages(final, self.offset, self.count, self.size, found), extra

    def abort(self) -> None:
        """Drop an unfinished build (an error while reading)."""
        self._out.close()
        self._path.unlink(missing_ok=True)


def _private_file(path: Path, mode: str) -> io.IOBase:
    """A new file only the node's user can read or write (0600 whatever the umask)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    os.fchmod(descriptor, FILE_MODE)  # an existing file keeps its mode through O_CREAT
    return os.fdopen(descriptor, mode)


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True
