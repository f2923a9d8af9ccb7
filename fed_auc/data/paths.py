"""Image paths kept inside the site's data root.

A CSV row names an image file; before, any file on the machine could be named (``../../``,
an absolute path, a symlink out of the folder) and only the image decoder stood between it
and the cache: a CSV edited by someone else, or copied from another site, read whatever the
node's user can read. Each path is resolved (``..`` and every symlink on the way followed)
and must stay under the resolved data root, unless the site file says otherwise
(``[data] images_outside_root = true``: archives spread over several mounts). A path
outside is refused by name: the CSV, its line, the path as written and where it leads.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

ALLOW_SETTING = "[data] images_outside_root = true"


def contained_paths(
    csv_path: Path, root: Path, names: Sequence[str], lines: Sequence[int], outside_ok: bool
) -> list[Path]:
    """Each image path of the CSV (``names``, on ``lines``) under ``root``; with
    ``outside_ok`` false, one that leads outside ``root`` is an error naming it."""
    paths = [root / name for name in names]
    if outside_ok:
        return paths
    real_root = os.path.realpath(root)
    inside = real_root.rstrip(os.sep) + os.sep
    folders: dict[str, str] = {}  # each folder resolved once: 100,000 rows share few
    for path, name, line in zip(paths, names, lines, strict=True):
        real = _resolved(path, folders)
        if real != real_root and not real.startswith(inside):  # the root: not a file, later
            raise ValueError(
                f"{csv_path} line {line}: image path {name!r} leads to {real} (after '..' and "
                f"symlinks), outside the data root {real_root}: refused. Put the file under "
                f"the root, give the spec another root (csv:PATH:ROOT), or set "
                f"{ALLOW_SETTING} in the site file"
            )
    return paths


def _resolved(path: Path, folders: dict[str, str]) -> str:
    """``os.path.realpath(path)``, its folder's part looked up in ``folders`` (filled here):
    only a file that is itself a symlink is resolved again."""
    folder, name = os.path.split(os.fspath(path))  # not normalized: '..' after a symlink
    if name in ("", ".", ".."):  # goes up from where the symlink leads, not lexically
        return os.path.realpath(path)
    if folder not in folders:
        folders[folder] = os.path.realpath(folder)
    try:
        link = stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        link = False  # missing or unreadable: the image reader names it
    return os.path.realpath(path) if link else os.path.join(folders[folder], name)
