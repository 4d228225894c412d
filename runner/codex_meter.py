"""Codex's token usage while it runs, for the live caps and the suite budget.

``codex exec --json`` reports usage once, on ``turn.completed``, when the whole run ends, so
its stdout cannot stop a run that spends too much, and a run killed at a deadline or a cap
reports nothing there. Codex's own session record (the rollout, ``CODEX_HOME/sessions/…``)
gets a ``token_count`` event after every model response, carrying the session's running
total. So codex runs with a private CODEX_HOME in its scratch HOME (``private_codex_home``):
every entry of the operator's is linked there (config, profiles, login) except what a session
writes, so the rollout lands in the job root, never in the operator's home, and the meter
reads it as it grows.

The meter reads only ``token_count`` lines, a bounded line at a time; nothing of the
transcript leaves here but counts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from runner.atomic import write_bytes_atomic
from runner.codex_usage import MAX_LINE, USAGE_FIELDS, TokenCounts, count_of

SESSIONS = "sessions"
# What a session writes under CODEX_HOME: kept in the private one, never linked to the operator's.
SESSION_STATE = frozenset({SESSIONS, "archived_sessions", "history.jsonl", "log", "shell_snapshots", "tmp"})
SESSION_STATE_SUFFIXES = (".sqlite", ".sqlite-wal", ".sqlite-shm", ".db")
LIVE_USAGE = "codex.usage.json"  # under logs/: the latest counts, for a batch that keeps a suite budget
READ_CHUNK = 1 << 16


def private_codex_home(operator: Path | None, into: Path) -> Path:
    """A CODEX_HOME of the run's own at ``into``: links to the operator's entries, a sessions dir of its own."""
    into.mkdir(mode=0o700)
    if operator is not None and operator.is_dir():
        for entry in sorted(operator.iterdir()):
            if entry.name in SESSION_STATE or entry.name.endswith(SESSION_STATE_SUFFIXES):
                continue
            (into / entry.name).symlink_to(entry)
    (into / SESSIONS).mkdir(mode=0o700)
    return into


def _total_of(line: bytes) -> TokenCounts | None:
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):
        return None
    payload = event.get("payload") if isinstance(event, dict) else None
    if not isinstance(payload, dict) or payload.get("type") != "token_count":
        return None
    info = payload.get("info")
    total = info.get("total_token_usage") if isinstance(info, dict) else None
    if not isinstance(total, dict):
        return None
    return TokenCounts(**{field: count_of(total, field) for field in USAGE_FIELDS})


class LineMeter:
    """A running total read incrementally from a JSONL file as it grows, a bounded line at a time.

    Subclasses say which file (``_find``) and what a line adds (``_take``).
    """

    def __init__(self) -> None:
        self._file: Path | None = None
        self._offset = 0
        self._pending = b""
        self._skipping = False  # inside a line longer than MAX_LINE
        self.latest: TokenCounts | None = None

    def _find(self) -> Path | None:
        raise NotImplementedError

    def _take(self, line: bytes) -> None:
        raise NotImplementedError

    def poll(self) -> TokenCounts | None:
        """Read what was appended since the last poll; the latest total (None: none yet)."""
        if self._file is None:
            self._file = self._find()
            if self._file is None:
                return self.latest
        try:
            fd = os.open(self._file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return self.latest
        try:
            os.lseek(fd, self._offset, os.SEEK_SET)
            while chunk := os.read(fd, READ_CHUNK):
                self._offset += len(chunk)
                self._feed(chunk)
        finally:
            os.close(fd)
        return self.latest

    def _feed(self, chunk: bytes) -> None:
        data = self._pending + chunk
        *lines, self._pending = data.split(b"\n")
        for line in lines:
            if self._skipping:
                self._skipping = False  # the over-long line ends here
                continue
            self._take(line)
        if len(self._pending) > MAX_LINE:
            self._pending, self._skipping = b"", True


class UsageMeter(LineMeter):
    """The latest running total in the codex session's rollout (its ``token_count`` events)."""

    def __init__(self, codex_home: Path) -> None:
        super().__init__()
        self._sessions = codex_home / SESSIONS

    def _find(self) -> Path | None:
        found = sorted(p for p in self._sessions.rglob("rollout-*.jsonl") if p.is_file() and not p.is_symlink())
        return found[0] if found else None

    def _take(self, line: bytes) -> None:
        if b"token_count" in line:
            counted = _total_of(line)
            if counted is not None:
                self.latest = counted


def write_live_usage(path: Path, usage: TokenCounts, cost_usd: float | None) -> None:
    """The latest counts (and their cost), private, replaced atomically."""
    record = {"total_tokens": usage.total, "cost_usd": cost_usd, **usage.__dict__}
    write_bytes_atomic(path, json.dumps(record, sort_keys=True).encode(), mode=0o600)
