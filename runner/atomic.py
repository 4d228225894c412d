"""Writing the runner's files: atomically (a reader sees the old file or the new one, never
half of one), and private logs never through a link that someone else planted."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

from runner.errors import BadInputError


def write_bytes_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def render_json(payload: Any) -> bytes:
    """The one JSON rendering of public and marker files, so reruns are byte-identical."""
    return (json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def write_json_atomic(path: Path, payload: Any) -> None:
    write_bytes_atomic(path, render_json(payload))


def open_private(path: Path) -> BinaryIO:
    """A private log, truncated and opened for writing, never through a planted link.

    Raises:
        BadInputError: its directory is a link or not a directory.
    """
    parent = path.parent
    parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not stat.S_ISDIR(os.lstat(parent).st_mode):
        raise BadInputError(f"{parent.name}/ in the job root is a link or not a directory; remove it and run again")
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            os.unlink(path)  # a link or FIFO where a log belongs
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "wb")
