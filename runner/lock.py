"""One run per job root at a time: an advisory ``flock`` on ``<job root>/.runner.lock``.

Invariant: while the lock is held, no other runner process works on this job
root, so containers labelled with its job id and no live run are strays.
The kernel drops the lock when the process dies, even by SIGKILL.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runner.errors import JobRootBusyError

LOCK_NAME = ".runner.lock"


@contextmanager
def job_root_lock(root: Path, *, name: str = LOCK_NAME, what: str = "runner") -> Iterator[None]:
    """Hold the lock ``root/name`` for the block (a batch locks its jobs directory the same way).

    Raises:
        JobRootBusyError: another process holds it (its pid is named).
    """
    root.mkdir(parents=True, exist_ok=True)
    path = root / name
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            place = "--jobs-dir" if what == "batch" else "--job-root"
            raise JobRootBusyError(
                f"another {what} (pid {holder}) is working on this {place.lstrip('-').replace('-', ' ')}; "
                f"wait for it to finish or use another {place}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the flock
