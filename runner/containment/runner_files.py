"""Tamper check: the agent may write only ``buggy-source/``; the runner's own files are verified.

Codex runs with ``--sandbox workspace-write --cd buggy-source`` and without the
job root, but the runner does not rely on that: it snapshots its own files
(markers, prompt, patches, public files, older logs) before the agent runs, and
afterwards restores whatever changed, removes what appeared (links and FIFOs
included), and reports it. One larger than ``KEEP_LIMIT`` is verified by hash only.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from runner.atomic import write_bytes_atomic
from runner.errors import TamperCheckError
from runner.jobroot import AGENT_HOME, BASELINE_GIT_DIR, BUGGY_SOURCE, LAST_MESSAGE
from runner.trees import remove_tree, walk

KEEP_LIMIT = 4 * 1024 * 1024
# The agent's to write, or checked another way (the codex logs are its output, through
# descriptors the runner opened). The baseline's objects are content-addressed and many;
# the rest of the baseline's git dir (config, hooks, refs, index) is snapshotted.
NOT_SNAPSHOTTED = frozenset({BUGGY_SOURCE, LAST_MESSAGE, ".runner.lock", AGENT_HOME})
BASELINE_OBJECTS = (BASELINE_GIT_DIR, "objects")


def _not_snapshotted(relative: str) -> bool:
    parts = tuple(relative.split("/", 2)[:2])
    return parts[0] in NOT_SNAPSHOTTED or parts == BASELINE_OBJECTS


def _runner_files(root: Path, skip: frozenset[str]) -> list[Path]:
    return [
        root / relative
        for relative, entry in walk(root, prune=_not_snapshotted)
        if relative not in skip and not entry.is_dir(follow_symlinks=False)
    ]


@dataclass
class RunnerFilesSnapshot:
    root: Path
    hashes: dict[str, str]
    contents: dict[str, bytes]
    skip: frozenset[str]

    @classmethod
    def capture(cls, root: Path, *, skip: frozenset[str] = frozenset()) -> RunnerFilesSnapshot:
        """``skip``: relative paths (the codex logs) that the caller verifies itself.

        Raises:
            TamperCheckError: the snapshot cannot be taken (any error: fails closed).
        """
        try:
            return cls._capture(root, skip)
        except Exception as e:
            raise TamperCheckError("before", e) from e

    @classmethod
    def _capture(cls, root: Path, skip: frozenset[str]) -> RunnerFilesSnapshot:
        hashes: dict[str, str] = {}
        contents: dict[str, bytes] = {}
        for path in _runner_files(root, skip):
            relative = path.relative_to(root).as_posix()
            data = path.read_bytes()
            hashes[relative] = hashlib.sha256(data).hexdigest()
            if len(data) <= KEEP_LIMIT:
                contents[relative] = data
        return cls(root=root, hashes=hashes, contents=contents, skip=skip)

    def restore(self) -> list[str]:
        """Put back what changed or vanished, remove what appeared; the paths touched, sorted.

        Raises:
            TamperCheckError: the check could not be completed (any error: fails closed).
        """
        try:
            return self._restore()
        except Exception as e:
            raise TamperCheckError("after", e) from e

    def _restore(self) -> list[str]:
        touched: list[str] = []
        now = {path.relative_to(self.root).as_posix(): path for path in _runner_files(self.root, self.skip)}
        for relative, path in now.items():
            if relative not in self.hashes:
                path.unlink(missing_ok=True)
                touched.append(relative)
        for relative, digest in self.hashes.items():
            path = self.root / relative
            if path.is_symlink() or not path.is_file():
                if path.is_dir() and not path.is_symlink():
                    remove_tree(path)
                else:
                    path.unlink(missing_ok=True)
            elif hashlib.sha256(path.read_bytes()).hexdigest() == digest:
                continue
            if relative in self.contents:
                write_bytes_atomic(path, self.contents[relative])
            touched.append(relative)
        return sorted(touched)


def same_file(handle: BinaryIO, path: Path) -> bool:
    """Is ``path`` still, without following links, the file ``handle`` writes?"""
    try:
        on_disk = os.lstat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(handle.fileno())
    return stat.S_ISREG(on_disk.st_mode) and (on_disk.st_dev, on_disk.st_ino) == (opened.st_dev, opened.st_ino)
