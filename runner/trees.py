"""Walking and removing directory trees without recursion.

Invariant: no function here recurses, so a tree thousands of levels deep (an
agent's, or an image's) costs memory, never the interpreter's recursion limit;
links are listed or removed, never followed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path


def walk(root: Path, *, prune: Callable[[str], bool] = lambda _relative: False) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Every entry under ``root`` as (relative path, entry), depth-first, from an explicit stack.

    ``prune`` skips a directory (and all below it) by its relative path.
    """
    stack = [""]
    while stack:
        relative_dir = stack.pop()
        with os.scandir(root / relative_dir if relative_dir else root) as entries:
            for entry in entries:
                relative = f"{relative_dir}/{entry.name}" if relative_dir else entry.name
                if prune(relative):
                    continue
                yield relative, entry
                if entry.is_dir(follow_symlinks=False):
                    stack.append(relative)


def remove_tree(path: Path) -> None:
    """``shutil.rmtree`` without recursion: every directory is emptied, deepest first, then removed.

    A link is removed, never followed; a missing path is fine.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(mode):
        path.unlink()
        return
    directories = [path]
    for relative, entry in walk(path):
        if entry.is_dir(follow_symlinks=False):
            directories.append(path / relative)
        else:
            os.unlink(entry.path)
    for directory in sorted(directories, key=lambda d: len(d.parts), reverse=True):
        os.rmdir(directory)
