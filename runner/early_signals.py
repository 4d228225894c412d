"""SIGINT and SIGTERM from the first instant: remembered until the CLI can act on them.

Importing the runner (docker, git, pydantic) takes a few hundred milliseconds; a
signal in that window used to kill the process with -15 before any handler was
installed, so a batch stopped early left no summary and its children were
recorded ``failed``. ``python -m runner`` installs this first, with nothing but
the standard library imported, and the CLI raises the remembered signal as the
usual ``KeyboardInterrupt`` once its own handlers are in place.
"""

from __future__ import annotations

import signal
from types import FrameType

_pending: list[int] = []


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
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def interrupt_from_now_on() -> None:
    """The runner's own handlers in place; a signal remembered before them is raised now."""
    signal.signal(signal.SIGTERM, raise_interrupt)
    signal.signal(signal.SIGINT, raise_interrupt)
