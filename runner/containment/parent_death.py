"""A batch's task process ends with its batch: the kernel sends it SIGTERM when the batch dies.

The batch starts each task in a session of its own (so a terminal's Ctrl-C reaches
the batch only), which also means a batch killed with -9 used to leave its tasks
running unwatched, holding their job roots' locks against the rerun. With
``PR_SET_PDEATHSIG`` the task gets SIGTERM the moment its batch dies, takes the
usual interrupt path (containers removed, marker ``interrupted``, public files
written) and the rerun resumes it.
"""

from __future__ import annotations

import ctypes
import os
import signal

BATCH_PARENT_ENV = "RUNNER_BATCH_PARENT"
_PR_SET_PDEATHSIG = 1


def follow_batch_parent(environ: dict[str, str] | os._Environ = os.environ) -> None:
    """In a batch's task: SIGTERM when the batch (named by ``RUNNER_BATCH_PARENT``) is gone."""
    parent = environ.get(BATCH_PARENT_ENV, "")
    if not parent.isdigit():
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return  # not Linux: the task runs on after its batch, as before
    if os.getppid() != int(parent):  # the batch died before the line above: act on it now
        os.kill(os.getpid(), signal.SIGTERM)
