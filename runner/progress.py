"""Batch progress: a live table on a terminal (rich), structured log lines elsewhere.

Both show the same facts: tasks done, running, failed, and each running task's
current phase. Output goes to stderr; stdout stays for the summary report.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType

import structlog

from runner.ledger import LedgerRow

log = structlog.get_logger(__name__)


class LogProgress:
    def started(self, tag: str) -> None:
        log.info("task_started", task=tag)

    def phase(self, tag: str, phase: str) -> None:
        log.info("task_phase", task=tag, task_phase=phase)

    def finished(self, row: LedgerRow) -> None:
        log.info(
            "task_finished", task=row.key, state=row.state, resolved=row.resolved,
            first_failed_phase=row.first_failed_phase, wall_seconds=row.wall_seconds, cost_usd=row.cost_usd,
        )

    def skipped(self, tag: str) -> None:
        log.info("task_skipped", task=tag, reason="completed in the ledger")

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class RichProgress:
    """A live table: one line per task, with counts of done, running and failed above it."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.live import Live

        self._total = total
        self._lock = threading.Lock()
        self._rows: dict[str, list[str]] = {}
        self._started: dict[str, float] = {}
        self._live = Live(console=Console(file=sys.stderr), refresh_per_second=4, get_renderable=self._render)

    def _render(self):  # noqa: ANN202 - a rich renderable
        from rich.table import Table

        with self._lock:
            rows = {tag: list(row) for tag, row in self._rows.items()}
            started = dict(self._started)
        states = [row[0] for row in rows.values()]
        running = states.count("running")
        done = len(states) - running
        failed = sum(1 for s in states if s in ("failed", "cancelled"))  # not scored: no verdict of the agent's
        table = Table(title=f"{done}/{self._total} done, {running} running, {failed} failed", expand=False)
        for column in ("task", "state", "phase", "seconds", "resolved"):
            table.add_column(column)
        now = time.monotonic()
        for tag, (state, phase, seconds, resolved) in rows.items():
            if state == "running":
                seconds = f"{now - started[tag]:.0f}"
            table.add_row(tag, state, phase, seconds, resolved)
        return table

    def started(self, tag: str) -> None:
        with self._lock:
            self._rows[tag] = ["running", "-", "0", "-"]
            self._started[tag] = time.monotonic()

    def phase(self, tag: str, phase: str) -> None:
        with self._lock:
            self._rows[tag][1] = phase

    def finished(self, row: LedgerRow) -> None:
        with self._lock:
            resolved = {True: "yes", False: "no", None: "-"}[row.resolved]
            self._rows[row.key] = [row.state.value, row.first_failed_phase or "-", f"{row.wall_seconds or 0:.0f}", resolved]

    def skipped(self, tag: str) -> None:
        with self._lock:
            self._rows[tag] = ["skipped", "-", "-", "-"]

    def __enter__(self) -> RichProgress:
        self._live.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._live.__exit__(exc_type, exc, tb)


def progress_for(total: int) -> LogProgress | RichProgress:
    return RichProgress(total) if sys.stderr.isatty() else LogProgress()
