"""Reading a file that anyone with write access to a jobs dir could have left there, within bounds.

Why: the views and the batch read files in a jobs dir that a task, an agent or a damaged
disk may have left in any shape. Read naively, a FIFO blocks the open for good, a link to
``/dev/zero`` reads until memory runs out, bytes that are not UTF-8 or JSON nested 100,000
deep raise out of the parser, and a 600 MB line is read whole. Here each such file is
refused with a short public reason (``Unreadable``) instead.

Invariants, for every file read through this module:
- its resolved location is inside ``root`` (links inside it are followed, links out are
  refused), checked before the open and again on the opened descriptor;
- it is opened ``O_NOFOLLOW | O_NONBLOCK`` and read only if ``fstat`` says it is a
  regular file, the very one ``lstat`` saw: no FIFO, device or socket is ever waited on;
- at most ``max_bytes + 1`` bytes are read (a line: ``max_line_bytes + 1`` kept in memory);
- it is decoded as strict UTF-8 and parsed by a parser that cannot recurse without
  bound (pydantic-core's, which stops at about 200 levels), then held to ``max_depth``.
Errors name the file relative to ``root`` (never an absolute path) and never quote it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import pydantic_core

from runner.errors import UnreadableFileError

_CHUNK = 1 << 16


class Unreadable(str, Enum):
    """Why a file (or a row read from one) was not used: short, public, a closed set."""

    MISSING = "missing"
    OUTSIDE = "outside_jobs_dir"  # it resolves (through a link) to a place outside the root
    NOT_REGULAR = "not_a_regular_file"  # a FIFO, a device, a socket, a directory
    TOO_LARGE = "too_large"
    NOT_UTF8 = "not_utf8"
    TOO_DEEP = "too_deep"
    NOT_JSON = "not_json"
    IO_ERROR = "io_error"  # permission denied, an I/O error
    INVALID_LEDGER = "invalid_ledger"  # JSON, but not {"rows": [...]}
    INVALID_ROW = "invalid_row"  # a row that does not validate (an unsafe tag, a 100 KB label)


_HINTS = {
    Unreadable.MISSING: "it is not there",
    Unreadable.OUTSIDE: "it is a link out of the directory; replace it with the file itself",
    Unreadable.NOT_REGULAR: "it is not a regular file (a FIFO, a device or a directory); move it aside",
    Unreadable.TOO_LARGE: "it is larger than a runner ever writes; move it aside",
    Unreadable.NOT_UTF8: "it is not UTF-8 text; move it aside",
    Unreadable.TOO_DEEP: "its JSON is nested deeper than a runner ever writes; move it aside",
    Unreadable.NOT_JSON: "it is not JSON; move it aside",
    Unreadable.IO_ERROR: "it cannot be read (permissions or an I/O error)",
    Unreadable.INVALID_LEDGER: "it is not a run ledger; move it aside",
    Unreadable.INVALID_ROW: "a row does not validate",
}


def _refused(name: str, unreadable: Unreadable) -> UnreadableFileError:
    return UnreadableFileError(name, unreadable, _HINTS[unreadable])


def public_name(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` when it is below it, else its last component only."""
    absolute, base = os.path.abspath(path), os.path.abspath(root)
    return os.path.relpath(absolute, base) if absolute != base and _inside(absolute, base) else path.name


def _inside(candidate: str, root: str) -> bool:
    return candidate == root or candidate.startswith(root.rstrip("/") + "/")


def _open_regular(path: Path, root: Path) -> tuple[int, os.stat_result]:
    """A read-only descriptor of the regular file at ``path``, which must resolve inside ``root``."""
    name = public_name(path, root)
    root_real = os.path.realpath(root)
    try:
        real = os.path.realpath(path, strict=True)
    except FileNotFoundError:
        raise _refused(name, Unreadable.MISSING) from None
    except OSError:  # a loop of links
        raise _refused(name, Unreadable.NOT_REGULAR) from None
    if not _inside(real, root_real):
        raise _refused(name, Unreadable.OUTSIDE)
    try:
        seen = os.lstat(real)
    except FileNotFoundError:
        raise _refused(name, Unreadable.MISSING) from None
    except OSError:
        raise _refused(name, Unreadable.IO_ERROR) from None
    if not stat.S_ISREG(seen.st_mode):
        raise _refused(name, Unreadable.NOT_REGULAR)  # never opened: a FIFO's open would block
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise _refused(name, Unreadable.MISSING) from None
    except OSError as e:  # swapped for a link (ELOOP) or a socket (ENXIO) since the lstat
        why = Unreadable.NOT_REGULAR if e.errno in (errno.ELOOP, errno.ENXIO) else Unreadable.IO_ERROR
        raise _refused(name, why) from None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino):
            raise _refused(name, Unreadable.NOT_REGULAR)
        try:  # where the kernel says it opened: a directory on the way may have become a link meanwhile
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            where = real
        if not _inside(where, root_real):
            raise _refused(name, Unreadable.OUTSIDE)
    except BaseException:
        os.close(fd)
        raise
    return fd, opened


def read_bounded(path: Path, *, root: Path, max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path`` (inside ``root``), refused beyond ``max_bytes``.

    Raises:
        UnreadableFileError: missing, outside the root, not a regular file, too large, or an I/O error.
    """
    name = public_name(path, root)
    fd, opened = _open_regular(path, root)
    try:
        if opened.st_size > max_bytes:
            raise _refused(name, Unreadable.TOO_LARGE)
        chunks: list[bytes] = []
        total = 0
        while True:
            try:
                chunk = os.read(fd, min(_CHUNK * 16, max_bytes + 1 - total))
            except OSError:
                raise _refused(name, Unreadable.IO_ERROR) from None
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            if total > max_bytes:  # it grew since the fstat
                raise _refused(name, Unreadable.TOO_LARGE)
            chunks.append(chunk)
    finally:
        os.close(fd)


def read_tail(path: Path, *, root: Path, max_bytes: int) -> tuple[bytes, bool]:
    """The last ``max_bytes`` of the regular file at ``path`` (inside ``root``), and whether
    that is not the whole file.

    Raises:
        UnreadableFileError: missing, outside the root, not a regular file, or an I/O error.
    """
    name = public_name(path, root)
    fd, opened = _open_regular(path, root)
    try:
        start = max(0, opened.st_size - max_bytes)
        try:
            data = os.pread(fd, max_bytes, start)
        except OSError:
            raise _refused(name, Unreadable.IO_ERROR) from None
        return data, start > 0
    finally:
        os.close(fd)


def _depth_exceeds(value: Any, max_depth: int) -> bool:
    """Is ``value`` nested deeper than ``max_depth`` containers? Iterative: no recursion to exhaust."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def parse_json_bounded(data: bytes, *, name: str, max_depth: int) -> Any:
    """``data`` as strict UTF-8 JSON (no NaN, no Infinity) nested at most ``max_depth`` deep.

    Raises:
        UnreadableFileError: not UTF-8, not JSON, or too deep; the data is never quoted.
    """
    try:
        data.decode("utf-8")  # strict; the parser then reads the same bytes
    except UnicodeDecodeError:
        raise _refused(name, Unreadable.NOT_UTF8) from None
    try:
        value = pydantic_core.from_json(data, allow_inf_nan=False)
    except ValueError as e:
        deep = str(e).startswith("recursion limit")
        raise _refused(name, Unreadable.TOO_DEEP if deep else Unreadable.NOT_JSON) from None
    if isinstance(value, (dict, list)) and _depth_exceeds(value, max_depth):
        raise _refused(name, Unreadable.TOO_DEEP)
    return value


def read_bounded_json(path: Path, *, root: Path, max_bytes: int, max_depth: int) -> Any:
    """The JSON document in the regular file at ``path`` (inside ``root``), within every bound.

    Raises:
        UnreadableFileError: see ``read_bounded`` and ``parse_json_bounded``.
    """
    return parse_json_bounded(read_bounded(path, root=root, max_bytes=max_bytes),
                              name=public_name(path, root), max_depth=max_depth)


@dataclass(frozen=True)
class BoundedLine:
    """One line of a bounded stream: its bytes, or why it has none (``too_large``)."""

    number: int  # 1-based
    data: bytes | None  # without its newline; None when refused
    unreadable: Unreadable | None
    terminated: bool  # ended by a newline (False: the file's last bytes, a torn append perhaps)


def iter_bounded_lines(path: Path, *, root: Path, max_line_bytes: int, max_total_bytes: int) -> Iterator[BoundedLine]:
    """The lines of the regular file at ``path`` (inside ``root``), streamed.

    A line longer than ``max_line_bytes`` is skipped without being kept (one ``too_large``
    line in its place), so memory stays bounded whatever the file holds.

    Raises:
        UnreadableFileError: the file itself is refused (see ``read_bounded``), or it reaches
            ``max_total_bytes`` (after the lines before that point were yielded).
    """
    name = public_name(path, root)
    fd, _ = _open_regular(path, root)
    try:
        pending = bytearray()
        overlong = False
        number = 1
        total = 0
        while True:
            try:
                chunk = os.read(fd, _CHUNK)
            except OSError:
                raise _refused(name, Unreadable.IO_ERROR) from None
            total += len(chunk)
            if total > max_total_bytes:
                raise _refused(name, Unreadable.TOO_LARGE)
            if not chunk:
                if overlong:
                    yield BoundedLine(number, None, Unreadable.TOO_LARGE, False)
                elif pending:
                    yield BoundedLine(number, bytes(pending), None, False)
                return
            start = 0
            while (end := chunk.find(b"\n", start)) != -1:
                if overlong or len(pending) + end - start > max_line_bytes:
                    yield BoundedLine(number, None, Unreadable.TOO_LARGE, True)
                else:
                    pending += chunk[start:end]
                    yield BoundedLine(number, bytes(pending), None, True)
                pending.clear()
                overlong = False
                number += 1
                start = end + 1
            if not overlong:
                pending += chunk[start:]
                if len(pending) > max_line_bytes:
                    pending.clear()
                    overlong = True
    finally:
        os.close(fd)
