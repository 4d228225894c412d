"""The runner's own stdout and stderr: a reader going away never ends a run.

A batch killed with -9, or ``python -m runner ... 2>&1 | head -3``, closes the
read end of the pipe the runner logs to. Python ignores SIGPIPE, so the next
write raises ``BrokenPipeError`` wherever it happens (mid-phase, in a cleanup),
and the run would die half-way without its markers. Wrapped here, the first
failed write points the descriptor at ``/dev/null`` and output is dropped from
then on; the run goes on and writes its files, which are what counts.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any, TextIO

# Write errors that mean "nobody reads this any more", not a bug of the runner.
_READER_GONE = frozenset({errno.EPIPE, errno.ECONNRESET, errno.EBADF})


class ReaderSafeStream:
    """A text stream whose writes never raise once its reader is gone."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.reader_gone = False

    def _drop(self) -> None:
        """Point the descriptor at /dev/null: later writes (and the flush at exit) succeed."""
        self.reader_gone = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass

    def write(self, text: str) -> int:
        if self.reader_gone:
            return len(text)
        try:
            return self._stream.write(text)
        except OSError as e:
            if e.errno not in _READER_GONE:
                raise
            self._drop()
            return len(text)

    def flush(self) -> None:
        if self.reader_gone:
            try:
                self._stream.flush()  # now into /dev/null: empties what was held
            except OSError:
                pass
            return
        try:
            self._stream.flush()
        except OSError as e:
            if e.errno not in _READER_GONE:
                raise
            self._drop()
            try:
                self._stream.flush()
            except OSError:
                pass

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, ...
        return getattr(self._stream, name)


def guard_standard_streams() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` (once); call before logging is configured."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, ReaderSafeStream):
            setattr(sys, name, ReaderSafeStream(stream))
