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
    for path, name, line in zip(paths, names, lines, strict=True):
        real = os.path.realpath(path)
        if real != real_root and not real.startswith(inside):  # the root: not a file, later
            raise ValueError(
                f"{csv_path} line {line}: image path {name!r} leads to {real} (after '..' and "
                f"symlinks), outside the data root {real_root}: refused. Put the file under "
                f"the root, give the spec another root (csv:PATH:ROOT), or set "
                f"{ALLOW_SETTING} in the site file"
            )
    return paths
