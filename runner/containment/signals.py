"""SIGINT and SIGTERM from the first instant, and held back around calls that must finish.

Importing the runner (docker, git, pydantic) takes a few hundred milliseconds; a
signal in that window used to kill the process with -15 before any handler was
installed, so a batch stopped early left no summary and its children were
recorded ``failed``. ``python -m runner`` installs this first, with nothing but
the standard library imported, and the CLI raises the remembered signal as the
usual ``KeyboardInterrupt`` once its own handlers are in place.

Some calls must not be cut half-way: a container create whose request reached the
daemon but whose answer the runner never read leaves a container nobody owns (the
daemon finishes creating it after the runner's cleanup has looked for it). Inside
``deferred()`` an interrupt is remembered and raised when the block ends, once the
call has answered and its result is in hand.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_pending: list[int] = []
_deferring = 0  # depth of deferred() blocks in the main thread (handlers run there only)
_held: list[int] = []


def _remember(signum: int, _frame: FrameType | None) -> None:
    _pending.append(signum)


def install() -> None:
    signal.signal(signal.SIGINT, _remember)
    signal.signal(signal.SIGTERM, _remember)


def pending() -> int | None:
    """The first signal that came before the CLI's handlers, if any."""
    return _pending[0] if _pending else None


def raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    """SIGINT and SIGTERM end the run through every ``finally`` (container removal, restores).

    Once: later signals are ignored, so a second Ctrl-C cannot break the cleanup half-way.
    Inside ``deferred()`` the interrupt waits for the block's end.

    SIG_IGN, not a handler that does nothing: the interpreter puts its Python handlers back to
    the default while it exits, so a supervisor's repeated SIGTERM would kill a task that had
    already written its outcome (exit -15, not 130). An ignored disposition is inherited by a
    process started from now on, though, and such a process ignores a SIGTERM until it installs
    its own handlers: a supervisor stopping its tasks signals them until they are gone
    (``TaskProcesses.stop_until_idle``), never once.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if _deferring:
        _held.append(signum)
        return
    raise KeyboardInterrupt(f"signal {signum}")


def interrupt_from_now_on() -> None:
    """The runner's own handlers in place; a signal remembered before them is raised now."""
    signal.signal(signal.SIGTERM, raise_interrupt)
    signal.signal(signal.SIGINT, raise_interrupt)


@contextmanager
def deferred() -> Iterator[None]:
    """An interrupt during the block is raised when it ends (in the main thread; a no-op elsewhere)."""
    global _deferring
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if not _deferring and _held:
            signum = _held.pop()
            _held.clear()
            raise KeyboardInterrupt(f"signal {signum}")
