"""A phase's own deadline: a watchdog that ends what blocks, and a check for what keeps going.

Why: extract and baseline had none, so a ``get_archive`` stream that stalled or never ended,
or a ``git add`` of a huge tree, held one host for ever. A phase runs inside ``PhaseDeadline``:
- at the deadline a watchdog thread runs what the phase registered with ``on_expiry`` (shut
  the archive stream's socket down, so that a read blocked in ``recv`` returns at once);
- ``check()`` between chunks ends a stream that keeps sending bytes;
- every git the runner starts meanwhile is killed at the deadline (``runner.gitops``: ``timeout -s KILL``);
- whatever the phase raises once the deadline has passed (a truncated stream, a killed git)
  becomes ``PhaseTimeoutError`` naming the phase, its flag and the deadline; an interrupt
  stays an interrupt, and a phase that finished anyway keeps its result.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import Token
from types import TracebackType

import structlog

from runner.errors import PhaseTimeoutError
from runner.gitops import GIT_DEADLINE

log = structlog.get_logger(__name__)


class PhaseDeadline:
    """``with PhaseDeadline("extract", 1800, flag="--extract-timeout") as deadline: ...``"""

    def __init__(self, phase: str, seconds: float, *, flag: str) -> None:
        self.phase, self.seconds, self.flag = phase, seconds, flag
        self.ends_at = 0.0
        self._expired = threading.Event()
        self._lock = threading.Lock()  # the watchdog's cancels and their registration, one at a time
        self._cancels: dict[int, Callable[[], None]] = {}
        self._timer: threading.Timer | None = None
        self._git_token: Token[float | None] | None = None

    def __enter__(self) -> PhaseDeadline:
        self.ends_at = time.monotonic() + self.seconds
        self._timer = threading.Timer(self.seconds, self._expire)
        self._timer.daemon = True
        self._timer.name = f"{self.phase}-deadline"
        self._timer.start()
        self._git_token = GIT_DEADLINE.set(self.ends_at)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _tb: TracebackType | None
    ) -> None:
        assert self._timer is not None
        self._timer.cancel()
        with self._lock:  # a watchdog half-way through its cancels finishes first
            self._cancels.clear()
        if self._git_token is not None:
            GIT_DEADLINE.reset(self._git_token)
        if error is None or not isinstance(error, Exception) or not self.expired:
            return None
        if isinstance(error, PhaseTimeoutError):
            return None
        log.warning("phase_deadline_passed", deadline_seconds=self.seconds, ended=type(error).__name__)
        raise self.error() from error

    @property
    def expired(self) -> bool:
        return self._expired.is_set() or (self.ends_at > 0 and time.monotonic() >= self.ends_at)

    def remaining(self) -> float:
        return max(0.0, self.ends_at - time.monotonic())

    def error(self) -> PhaseTimeoutError:
        return PhaseTimeoutError(self.phase, self.seconds, self.flag)

    def check(self) -> None:
        """Raises: PhaseTimeoutError once the deadline has passed."""
        if self.expired:
            raise self.error()

    @contextmanager
    def on_expiry(self, cancel: Callable[[], None]) -> Iterator[None]:
        """Run ``cancel`` (from the watchdog's thread) if the deadline passes during the block."""
        key = id(cancel)
        with self._lock:
            self._cancels[key] = cancel
            late = self._expired.is_set()
        if late:
            self._run(cancel)
        try:
            yield
        finally:
            with self._lock:
                self._cancels.pop(key, None)

    def _expire(self) -> None:
        with self._lock:
            self._expired.set()
            cancels = list(self._cancels.values())
            log.warning("phase_deadline_reached", phase=self.phase, deadline_seconds=self.seconds,
                        cancelling=len(cancels))
            for cancel in cancels:
                self._run(cancel)

    @staticmethod
    def _run(cancel: Callable[[], None]) -> None:
        try:
            cancel()
        except Exception as e:  # a cancel that fails leaves the per-chunk check to end the phase
            log.warning("deadline_cancel_failed", error_type=type(e).__name__)
