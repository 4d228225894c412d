"""Where a local batch's task rows come from: its ledger (a fleet suite's come from ``runner.fleet.views``).

Invariants: only public files are read (``run-ledger.json`` and its journal: a row carries
every fact the views show); never a prompt, a patch, a log or a marker. Each is read
through ``runner.bounded_read`` (inside the jobs dir, a regular file, bounded in size and
depth, strict UTF-8), so a hostile or damaged jobs dir gives rows in state ``unreadable``
with a short reason: never a hang, a traceback, or the bad file's own text on the page.
A row's tag is shown only when it is a safe tag.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import structlog
from pydantic import ValidationError

from reducers.costs import BudgetFigures
from reducers.outcome import FINISHED_STATES, TaskState
from runner.budget import MAX_BUDGET_USD
from runner.bounded_read import Unreadable, UnreadableFileError, iter_bounded_lines, parse_json_bounded, read_bounded_json
from runner.errors import BadInputError
from runner.ledger import (
    JOURNAL_LINE_MAX_BYTES, JOURNAL_MAX_BYTES, LEDGER_JOURNAL, LEDGER_JSON, LEDGER_MAX_BYTES, LEDGER_MAX_DEPTH,
    LedgerRow, row_key,
)
from runner.settings import is_safe_tag
from runner.views.model import TIMED_PHASES, TaskRow

log = structlog.get_logger(__name__)

LOCAL_SUITE = "local"
LOCAL_HOST = "local"
@dataclass(frozen=True)
class _Refused:
    """A ledger entry that is not a row: ``where`` names its place (``ledger-row-3``) when its tag is unsafe."""

    where: str
    identity: tuple[str, int] | None
    unreadable: Unreadable


def _identity(tag: object, attempt: object) -> tuple[str, int] | None:
    """(tag, attempt) as the page may show them, or None when either is not safe to show (or to use in a path)."""
    if not isinstance(tag, str) or not is_safe_tag(tag):
        return None
    if attempt is None:
        return tag, 1
    if isinstance(attempt, int) and not isinstance(attempt, bool) and 1 <= attempt <= 1_000_000:
        return tag, attempt
    return None


def _unreadable_row(suite: str, refused: _Refused) -> TaskRow:
    tag, attempt = refused.identity or (refused.where, 0)  # attempt 0: a place in a file, never a task's attempt
    log.warning("view_row_unreadable", tag=tag, attempt=attempt, unreadable=refused.unreadable.value)
    return TaskRow(suite=suite, tag=tag, attempt=attempt, state=TaskState.UNREADABLE, unreadable=refused.unreadable)


def _task_row(row: LedgerRow, suite: str, where: str) -> TaskRow:
    """A batch ledger row as the views' row: the same facts (``reducers.outcome``), the same states."""
    identity = _identity(row.tag, row.attempt)
    if identity is None:
        return _unreadable_row(suite, _Refused(where, None, Unreadable.INVALID_ROW))
    finished = row.state in FINISHED_STATES
    resolved = bool(row.resolved) if finished else None
    try:
        return TaskRow(
            suite=suite,
            tag=row.tag,
            attempt=identity[1],  # a batch without --attempts keeps DIR/<tag>: attempt 1
            state=row.state,
            host=LOCAL_HOST,
            phase=row.first_failed_phase if row.first_failed_phase in TIMED_PHASES else None,  # where it stopped
            resolved=resolved,
            infra_failure=row.infra_failure if finished else None,
            failure_label=None if resolved else row.failure_label,
            phase_seconds={k: v for k, v in row.phase_durations_seconds.items() if k in TIMED_PHASES},
            wall_seconds=row.wall_seconds,
            tokens={"input": row.input_tokens, "cached_input": row.cached_input_tokens, "output": row.output_tokens},
            cost_usd=row.cost_usd,
            agent=row.agent or row.arm,  # an --agents row names its agent before it has run
            image=row.image_digest or row.image_id,
        )
    except ValidationError:  # a 100 KB label, a negative count: never quoted (pydantic's message would)
        return _unreadable_row(suite, _Refused(where, identity, Unreadable.INVALID_ROW))


class _Entries:
    """The ledger's rows by key as the batch replays them (the journal over the snapshot), refusals included."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[str, str], tuple[str, LedgerRow | _Refused]] = {}
        self.budget: BudgetFigures | None = None

    def refuse(self, where: str, unreadable: Unreadable, identity: tuple[str, int] | None = None,
               attempt: int | None = None) -> None:
        # keyed as its row would be (``attempt`` as the ledger has it), so a later good row replaces it
        key = ("row", row_key(identity[0], attempt)) if identity else ("place", where)
        self.by_key[key] = (where, _Refused(where, identity, unreadable))

    def take(self, raw: object, where: str) -> None:
        try:
            row = LedgerRow.from_disk(raw)
        except ValidationError:
            fields = raw if isinstance(raw, dict) else {}
            identity = _identity(fields.get("tag"), fields.get("attempt"))
            self.refuse(where, Unreadable.INVALID_ROW, identity, fields.get("attempt") if identity else None)
            return
        self.by_key[("row", row.key)] = (where, row)


def _read_snapshot(jobs_dir: Path, entries: _Entries) -> None:
    try:
        document = read_bounded_json(jobs_dir / LEDGER_JSON, root=jobs_dir, max_bytes=LEDGER_MAX_BYTES,
                                     max_depth=LEDGER_MAX_DEPTH)
    except UnreadableFileError as e:
        entries.refuse(LEDGER_JSON, e.unreadable)
        return
    rows = document.get("rows") if isinstance(document, dict) else None
    if not isinstance(rows, list):
        entries.refuse(LEDGER_JSON, Unreadable.INVALID_LEDGER)
        return
    entries.budget = _snapshot_budget(document)
    for number, raw in enumerate(rows, 1):
        entries.take(raw, f"ledger-row-{number}")


def _snapshot_budget(document: dict[str, object]) -> BudgetFigures | None:
    """The last batch's ``--suite-budget-usd``, as its ledger wrote it (anything else: no budget shown)."""
    cost = document.get("cost")
    limit = cost.get("budget_usd") if isinstance(cost, dict) else None
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 < limit <= MAX_BUDGET_USD:
        return None
    return BudgetFigures(limit_usd=float(limit))


def _replay_journal(jobs_dir: Path, entries: _Entries) -> None:
    """Each line a row, streamed with a bound per line; a torn last line (a crash mid-append) is skipped."""
    path = jobs_dir / LEDGER_JOURNAL
    if not os.path.lexists(path):
        return
    try:
        for line in iter_bounded_lines(path, root=jobs_dir, max_line_bytes=JOURNAL_LINE_MAX_BYTES,
                                       max_total_bytes=JOURNAL_MAX_BYTES):
            where = f"journal-line-{line.number}"
            if line.unreadable is not None:
                entries.refuse(where, line.unreadable)
                continue
            if line.data is None or not line.data.strip():
                continue
            try:
                raw = parse_json_bounded(line.data, name=where, max_depth=LEDGER_MAX_DEPTH)
            except UnreadableFileError as e:
                if line.terminated:
                    entries.refuse(where, e.unreadable)
                continue
            entries.take(raw, where)
    except UnreadableFileError as e:
        entries.refuse(LEDGER_JOURNAL, e.unreadable)


@dataclass(frozen=True)
class LocalSuite:
    rows: list[TaskRow]
    budget: BudgetFigures | None  # the batch's suite budget, when its last run had one


def rows_from_jobs_dir(jobs_dir: Path, *, suite: str = LOCAL_SUITE) -> list[TaskRow]:
    return read_jobs_dir(jobs_dir, suite=suite).rows


def read_jobs_dir(jobs_dir: Path, *, suite: str = LOCAL_SUITE) -> LocalSuite:
    """One row per task of a local batch, from ``DIR/run-ledger.json`` and its journal, and its budget.

    A file or a row that cannot be used is one row in state ``unreadable`` (its reason in
    ``TaskRow.unreadable``); the other rows stand.

    Raises:
        BadInputError: the directory has no ledger at all.
    """
    jobs_dir = jobs_dir.expanduser().resolve()
    if not os.path.lexists(jobs_dir / LEDGER_JSON):
        raise BadInputError(f"--jobs-dir has no {LEDGER_JSON}; run a batch there first (--execute --jobs-dir DIR)")
    entries = _Entries()
    _read_snapshot(jobs_dir, entries)
    _replay_journal(jobs_dir, entries)
    rows = [
        _task_row(entry, suite, where) if isinstance(entry, LedgerRow) else _unreadable_row(suite, entry)
        for where, entry in entries.by_key.values()
    ]
    return LocalSuite(rows=sorted(rows, key=lambda r: r.key), budget=entries.budget)
