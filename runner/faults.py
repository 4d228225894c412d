"""Crash points: the runner killed with SIGKILL at a chosen instant, for the crash tests.

Invariant: inert unless ``RUNNER_CRASH_AT`` names the point; a crash point only
ever kills the runner's own process, exactly as ``kill -9`` from outside would,
at an instant no outside signal can hit reliably.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "RUNNER_CRASH_AT"


def crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
