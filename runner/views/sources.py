"""Where task rows come from: the local batch's ledger, or (once wired) a daemon suite's ledger.

Invariant: only public files are read (``run-ledger.json`` and each task's
``benchmark_run.compact.json``); never a prompt, a patch, a log or a marker.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import structlog

from reducers.passk import is_infra_failure
from runner.errors import BadInputError
from runner.jobroot import BENCHMARK_RUN
from runner.ledger import LEDGER_JSON, LedgerRow, RunLedger
from reducers.models import LedgerState
from runner.views.model import TIMED_PHASES, TaskRow, TaskState

log = structlog.get_logger(__name__)

LOCAL_SUITE = "local"
LOCAL_HOST = "local"
# The batch ledger's states (runner.batch) as task states.
_STATE = {
    LedgerState.COMPLETED: TaskState.DONE,
    LedgerState.FAILED: TaskState.FAILED,
    LedgerState.BAD_INPUT: TaskState.FAILED,
    LedgerState.BAD_ENVIRONMENT: TaskState.FAILED,
    LedgerState.INTERRUPTED: TaskState.CANCELLED,
}


def _cached_input_tokens(job_root: Path) -> int:
    """The compact run's cached-input count (the ledger keeps input and output only)."""
    try:
        run = json.loads((job_root / BENCHMARK_RUN).read_text(encoding="utf-8"))
        value = run["metrics"]["cache_tokens"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return 0  # refused before any output, or unreadable: the ledger row still stands
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _task_row(jobs_dir: Path, row: LedgerRow, suite: str) -> TaskRow:
    # A batch with --attempts keeps each attempt at DIR/<tag>/attempt-<i>; without, DIR/<tag> is attempt 1.
    job_root = jobs_dir / row.tag if row.attempt is None else jobs_dir / row.tag / f"attempt-{row.attempt}"
    attempt = row.attempt or 1
    state = _STATE.get(row.state, TaskState.FAILED)
    finished = state in (TaskState.DONE, TaskState.FAILED)
    resolved = bool(row.resolved) if finished else None
    return TaskRow(
        suite=suite,
        tag=row.tag,
        attempt=attempt,
        state=state,
        host=LOCAL_HOST,
        phase=row.first_failed_phase if state is TaskState.FAILED and row.first_failed_phase in TIMED_PHASES else None,
        resolved=resolved,
        infra_failure=is_infra_failure(row.state, row.failure_label) if finished else None,
        # a task refused before it wrote a compact file has no label: its batch state stands in
        failure_label=None if resolved else (row.failure_label or (row.state if finished else None)),
        phase_seconds={k: v for k, v in row.phase_durations_seconds.items() if k in TIMED_PHASES},
        wall_seconds=row.wall_seconds,
        tokens={
            "input": row.input_tokens,
            "cached_input": _cached_input_tokens(job_root),
            "output": row.output_tokens,
        },
    )


def rows_from_jobs_dir(jobs_dir: Path, *, suite: str = LOCAL_SUITE) -> list[TaskRow]:
    """One row per task of a local batch, from ``DIR/run-ledger.json`` and the compact files.

    Raises:
        BadInputError: the directory or its ledger is missing.
        CompactInputError: the ledger is malformed (naming the field).
    """
    jobs_dir = jobs_dir.expanduser().resolve()
    if not (jobs_dir / LEDGER_JSON).is_file():
        raise BadInputError(f"--jobs-dir has no {LEDGER_JSON}; run a batch there first (--execute --jobs-dir DIR)")
    ledger = RunLedger(jobs_dir, private_texts=[])  # read only: the guard applies when the views render
    return sorted((_task_row(jobs_dir, row, suite) for row in ledger.rows.values()), key=lambda r: r.key)


def rows_from_suite(broker_url: str, suite: str, namespace: str | None = None) -> list[TaskRow]:
    """One row per task and attempt of a daemon suite, from its ledger on the broker.

    Raises:
        BrokerUnavailableError: the broker does not answer (exit 3).
        BadInputError: the suite name is not a safe label.
    """
    from runner.fleet.broker import DEFAULT_NAMESPACE
    from runner.fleet.messages import check_suite
    from runner.fleet.views import rows_from_broker

    namespace = namespace or os.environ.get("RUNNER_FLEET_NAMESPACE", DEFAULT_NAMESPACE)
    return rows_from_broker(broker_url, check_suite(suite), namespace)
