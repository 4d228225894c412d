"""Tamper check: the agent may write only ``buggy-source/``; the runner's own files are verified.

Codex runs with ``--sandbox workspace-write --cd buggy-source`` and without the
job root, but the runner does not rely on that: it snapshots its own files
(markers, prompt, patches, public files) before the agent runs, and afterwards
restores whatever changed, removes what appeared, and reports it. The files
are small; one larger than ``KEEP_LIMIT`` is verified by hash only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from runner.atomic import write_bytes_atomic
from runner.jobroot import BUGGY_SOURCE, LAST_MESSAGE, LOGS

KEEP_LIMIT = 4 * 1024 * 1024
# Written by the agent's own run, or the agent's to write.
AGENT_AREAS = frozenset({BUGGY_SOURCE, LOGS, LAST_MESSAGE, ".runner.lock"})


def _runner_files(root: Path) -> list[Path]:
    return [
        path
        for path in root.rglob("*")
        if path.relative_to(root).parts[0] not in AGENT_AREAS and (path.is_file() or path.is_symlink())
    ]


@dataclass
class RunnerFilesSnapshot:
    root: Path
    hashes: dict[str, str]
    contents: dict[str, bytes]

    @classmethod
    def capture(cls, root: Path) -> RunnerFilesSnapshot:
        hashes: dict[str, str] = {}
        contents: dict[str, bytes] = {}
        for path in _runner_files(root):
            relative = path.relative_to(root).as_posix()
            data = path.read_bytes()
            hashes[relative] = hashlib.sha256(data).hexdigest()
            if len(data) <= KEEP_LIMIT:
                contents[relative] = data
        return cls(root=root, hashes=hashes, contents=contents)

    def restore(self) -> list[str]:
        """Put back what changed or vanished, remove what appeared; the paths touched, sorted."""
        touched: list[str] = []
        now = {path.relative_to(self.root).as_posix(): path for path in _runner_files(self.root)}
        for relative, path in now.items():
            if relative not in self.hashes:
                path.unlink()
                touched.append(relative)
        for relative, digest in self.hashes.items():
            path = self.root / relative
            if path.is_symlink() or not path.is_file():
                path.unlink(missing_ok=True)
            elif hashlib.sha256(path.read_bytes()).hexdigest() == digest:
                continue
            if relative in self.contents:
                write_bytes_atomic(path, self.contents[relative])
            touched.append(relative)
        return sorted(touched)
