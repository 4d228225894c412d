"""Streaming, refusing tar extraction of the image's source tree.

Invariants:
- the archive is read as a stream (``r|``): one member at a time, never whole;
- nothing lands outside ``dest``: absolute names, ``..``, links pointing outside,
  devices and FIFOs are refused (the whole extraction fails, naming the entry);
  setuid/setgid bits and foreign ownership are dropped (tarfile's ``data`` filter);
- every ``.git`` entry is left out: in the real images the buggy tree's history
  reaches the fixed commit, and that oracle must never reach the agent.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from runner.errors import UnsafeArchiveError

ORACLE_NAMES = frozenset({".git"})


@dataclass
class ExtractStats:
    files: int = 0
    directories: int = 0
    symlinks: int = 0
    bytes: int = 0
    oracle_entries_skipped: int = 0
    _seen_root: set[str] = field(default_factory=set, repr=False)


def _strip_root(name: str, entry: str) -> str | None:
    """``root/a/b`` -> ``a/b``; the root itself -> None. Refuses unsafe names."""
    path = PurePosixPath(name)
    if path.is_absolute():
        raise UnsafeArchiveError(entry, "absolute name")
    if ".." in path.parts:
        raise UnsafeArchiveError(entry, "'..' in name")
    parts = path.parts[1:]
    return PurePosixPath(*parts).as_posix() if parts else None


def extract_tree(stream: IO[bytes], dest: Path) -> ExtractStats:
    """Extract the single-root tar ``stream`` (as ``get_archive`` gives it) into ``dest``.

    Raises:
        UnsafeArchiveError: an entry would escape ``dest`` or is not a plain file,
            directory or link inside it.
    """
    stats = ExtractStats()
    dest.mkdir(parents=True, exist_ok=True)

    def admit(member: tarfile.TarInfo, dest_path: str) -> tarfile.TarInfo | None:
        entry = member.name[:200]
        relative = _strip_root(member.name, entry)
        if relative is None:
            return None
        if ORACLE_NAMES.intersection(PurePosixPath(relative).parts):
            stats.oracle_entries_skipped += 1
            return None
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise UnsafeArchiveError(entry, "device, FIFO or other special file")
        linkname = member.linkname
        if member.islnk():
            linkname = _strip_root(member.linkname, entry) or ""
            if not linkname or ORACLE_NAMES.intersection(PurePosixPath(linkname).parts):
                raise UnsafeArchiveError(entry, "hard link to an entry outside the tree")
        try:
            admitted = tarfile.data_filter(member.replace(name=relative, linkname=linkname, deep=False), dest_path)
        except tarfile.FilterError as e:
            raise UnsafeArchiveError(entry, type(e).__name__) from e
        if admitted.isfile() or admitted.islnk():
            stats.files += 1
            stats.bytes += admitted.size
        elif admitted.isdir():
            stats.directories += 1
        elif admitted.issym():
            stats.symlinks += 1
        return admitted

    with tarfile.open(fileobj=stream, mode="r|") as archive:
        archive.extractall(dest, filter=admit)
    return stats
