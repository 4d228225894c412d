"""Streaming, refusing tar extraction of the image's source tree.

Invariants:
- the archive is read as a stream (``r|``): one member at a time, never whole;
- nothing lands outside ``dest``: every entry goes under a directory this
  extractor made itself (so never through a link), files are created with
  ``O_EXCL|O_NOFOLLOW``, a name is never written twice, and every symlink must
  resolve inside ``dest`` once the tree is complete; absolute names, ``..``,
  devices, FIFOs and hard links to anything but an extracted file are refused:
  the whole extraction fails, naming the entry;
- setuid/setgid/sticky bits and group/other write bits are dropped, ownership
  and times are not restored (git needs neither);
- every ``.git`` entry is left out: in the real images the buggy tree's history
  reaches the fixed commit, and that oracle must never reach the agent.
Why not ``tarfile``'s ``data`` filter: it resolves every member's path on disk
(``realpath``), which made extraction twice as slow as ``docker cp``.
"""

from __future__ import annotations

import errno
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from runner.docker_utils import daemon_gone
from runner.errors import UnsafeArchiveError

# Errors of the host, not of the entry: raised as they are, so the run says "disk full", not "unsafe image".
_NOT_THE_ENTRYS_FAULT = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})

ORACLE_NAMES = frozenset({".git"})
FILE_MODE_MASK = 0o755
COPY_CHUNK = 1024 * 1024
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class ExtractStats:
    files: int = 0
    directories: int = 0
    symlinks: int = 0
    bytes: int = 0
    oracle_entries_skipped: int = 0


def _relative(name: str, entry: str, root: str | None = None) -> str | None:
    """``root/a/b`` -> ``a/b``; the root itself -> None. Refuses unsafe names and a second root."""
    if "\0" in name:
        raise UnsafeArchiveError(entry, "NUL in name")
    path = PurePosixPath(name)
    if path.is_absolute():
        raise UnsafeArchiveError(entry, "absolute name")
    if ".." in path.parts:
        raise UnsafeArchiveError(entry, "'..' in name")
    if root is not None and path.parts[:1] != (root,):
        raise UnsafeArchiveError(entry, "outside the archive's single root")
    parts = path.parts[1:]
    return "/".join(parts) if parts else None


@dataclass
class _Tree:
    """What has been made under ``dest``, so that nothing is made twice or through a link."""

    dest: Path
    directories: set[str] = field(default_factory=lambda: {""})
    files: set[str] = field(default_factory=set)
    symlinks: set[str] = field(default_factory=set)

    def taken(self, relative: str) -> bool:
        return relative in self.directories or relative in self.files or relative in self.symlinks

    def ensure_directory(self, relative: str, entry: str) -> None:
        """``relative`` and every missing parent, outermost first (no recursion: names may be deep)."""
        missing: list[str] = []
        while relative not in self.directories:
            if self.taken(relative):
                raise UnsafeArchiveError(entry, "a directory where a file or link was extracted")
            missing.append(relative)
            relative = relative.rpartition("/")[0]
        for directory in reversed(missing):
            os.mkdir(self.dest / directory, 0o755)
            self.directories.add(directory)

    def parent_ready(self, relative: str, entry: str) -> None:
        if self.taken(relative):
            raise UnsafeArchiveError(entry, "the name occurs twice")
        self.ensure_directory(relative.rpartition("/")[0], entry)


def _write_file(archive: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> None:
    source = archive.extractfile(member)
    fd = os.open(path, _CREATE, member.mode & FILE_MODE_MASK)
    try:
        remaining = member.size
        while remaining > 0:
            chunk = source.read(min(COPY_CHUNK, remaining)) if source else b""
            if not chunk:
                raise UnsafeArchiveError(member.name[:200], "truncated archive")
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
            remaining -= len(chunk)
    finally:
        os.close(fd)


def _check_links(tree: _Tree) -> None:
    """Once the tree is whole, every symlink must resolve inside it (links may chain)."""
    root = os.path.realpath(tree.dest)
    for relative in tree.symlinks:
        resolved = os.path.realpath(tree.dest / relative)
        if resolved != root and not resolved.startswith(root + os.sep):
            raise UnsafeArchiveError(relative[:200], "LinkOutsideDestinationError")


def extract_tree(stream: IO[bytes], dest: Path) -> ExtractStats:
    """Extract the single-root tar ``stream`` (as ``get_archive`` gives it) into ``dest``.

    ``dest`` must not exist yet: it is made here, and only this extractor writes in it.

    Raises:
        UnsafeArchiveError: an entry would escape ``dest`` or is not a plain file,
            directory, link or hard link inside it.
    """
    stats = ExtractStats()
    dest.mkdir(parents=True)
    tree = _Tree(dest=dest)
    try:
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            root: str | None = None
            for member in archive:
                # tarfile keeps every member it has read; a stream of 100,000 entries would cost
                # ~100 MB. Links are resolved here, not by tarfile, so none needs keeping.
                archive.members.clear()
                root = root or PurePosixPath(member.name).parts[0]
                try:
                    _extract_member(archive, member, tree, stats, root)
                except OSError as e:
                    if e.errno in _NOT_THE_ENTRYS_FAULT or daemon_gone(e):
                        raise  # a full disk or a lost daemon: the environment's fault, not the image's
                    raise UnsafeArchiveError(member.name[:200], f"cannot be created ({type(e).__name__})") from e
                except ValueError as e:  # a name too long, an empty link, ...
                    raise UnsafeArchiveError(member.name[:200], f"cannot be created ({type(e).__name__})") from e
    except tarfile.TarError as e:
        raise UnsafeArchiveError("<stream>", f"not a readable tar stream ({type(e).__name__})") from e
    _check_links(tree)
    return stats


def _extract_member(
    archive: tarfile.TarFile, member: tarfile.TarInfo, tree: _Tree, stats: ExtractStats, root: str
) -> None:
    entry = member.name[:200]
    relative = _relative(member.name, entry, root)
    if relative is None:
        return
    if ORACLE_NAMES.intersection(relative.split("/")):
        stats.oracle_entries_skipped += 1
        return
    if member.isdir():
        tree.ensure_directory(relative, entry)
        stats.directories += 1
        return
    tree.parent_ready(relative, entry)
    path = tree.dest / relative
    if member.isreg():
        _write_file(archive, member, path)
        tree.files.add(relative)
        stats.files += 1
        stats.bytes += member.size
    elif member.issym():
        if not member.linkname or member.linkname.startswith("/"):
            raise UnsafeArchiveError(entry, "AbsoluteLinkError")
        target = os.path.normpath(os.path.join(os.path.dirname(relative), member.linkname))
        if target == ".." or target.startswith("../"):
            raise UnsafeArchiveError(entry, "LinkOutsideDestinationError")
        os.symlink(member.linkname, path)
        tree.symlinks.add(relative)
        stats.symlinks += 1
    elif member.islnk():
        target = _relative(member.linkname, entry, root)
        if target is None or target not in tree.files:
            raise UnsafeArchiveError(entry, "hard link to an entry outside the tree")
        os.link(tree.dest / target, path, follow_symlinks=False)
        tree.files.add(relative)
        stats.files += 1
    else:
        raise UnsafeArchiveError(entry, "device, FIFO or other special file")
