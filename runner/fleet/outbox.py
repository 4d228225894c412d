"""A finished task's row, kept on this host until the suite ledger has it.

The broker may be gone when a task ends (Redis restarting, the network down), and
may come back empty. A verdict must never be lost to that: the worker writes each
final row here first (``<jobs>/<suite>/.worker-outbox/<tag>.attempt-<i>.json``,
atomically, outside every job root), then to the ledger, and removes it once the
ledger holds it; rows still here are written again whenever the broker answers.

A broker restart then costs time, never a verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import structlog
from pydantic import ValidationError

from runner.atomic import write_bytes_atomic
from runner.fleet.ledger import LedgerRow
from runner.tasks.protocol import SAFE_SUITE

log = structlog.get_logger(__name__)

OUTBOX = ".worker-outbox"


class Outbox:
    def __init__(self, jobs_dir: Path) -> None:
        self._jobs_dir = jobs_dir

    def _path(self, suite: str, row: LedgerRow) -> Path:
        arm = f".{row.arm}" if row.arm is not None else ""
        name = f"{row.tag}.eval-{row.patch}" if row.kind == "eval" else f"{row.tag}{arm}.attempt-{row.attempt}"
        return self._jobs_dir / suite / OUTBOX / f"{name}.json"

    def keep(self, suite: str, row: LedgerRow) -> None:
        path = self._path(suite, row)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, row.model_dump_json().encode(), mode=0o600)

    def delivered(self, suite: str, row: LedgerRow) -> None:
        self._path(suite, row).unlink(missing_ok=True)

    def pending(self) -> list[tuple[str, LedgerRow]]:
        """Every row kept and not yet delivered, with its suite (an unreadable file is skipped)."""
        found = []
        for path in sorted(self._jobs_dir.glob(f"*/{OUTBOX}/*.json")):
            suite = path.parent.parent.name
            if not SAFE_SUITE.fullmatch(suite):
                continue
            try:
                found.append((suite, LedgerRow.model_validate_json(path.read_bytes())))
            except (OSError, ValidationError):
                log.warning("outbox_row_unreadable", suite=suite)
        return found

    def flush(self, deliver: Callable[[str, LedgerRow], None]) -> int:
        """Hand each kept row to ``deliver`` (which raises while the broker is down); returns how many went."""
        sent = 0
        for suite, row in self.pending():
            deliver(suite, row)
            self.delivered(suite, row)
            sent += 1
        if sent:
            log.info("outbox_delivered", rows=sent)
        return sent
