"""Where task rows come from: the local batch's ledger, or (once wired) a daemon suite's ledger.

Invariant: only public files are read (``run-ledger.json`` and each task's
``benchmark_run.compact.json``); never a prompt, a patch, a log or a marker.
"""

from __future__ import annotations

import os
from pathlib import Path

import structlog

from reducers.outcome import FINISHED_STATES
from runner.errors import BadInputError
from runner.ledger import LEDGER_JSON, LedgerRow, RunLedger
from runner.views.model import TIMED_PHASES, TaskRow

log = structlog.get_logger(__name__)

LOCAL_SUITE = "local"
LOCAL_HOST = "local"


def _task_row(row: LedgerRow, suite: str) -> TaskRow:
    """A batch ledger row as the views' row: the same facts (``reducers.outcome``), the same states."""
    finished = row.state in FINISHED_STATES
    resolved = bool(row.resolved) if finished else None
    return TaskRow(
        suite=suite,
        tag=row.tag,
        attempt=row.attempt or 1,  # a batch without --attempts keeps DIR/<tag>: attempt 1
        state=row.state,
        host=LOCAL_HOST,
        phase=row.first_failed_phase if row.first_failed_phase in TIMED_PHASES else None,  # where it stopped
        resolved=resolved,
        infra_failure=row.infra_failure if finished else None,
        failure_label=None if resolved else row.failure_label,
        phase_seconds={k: v for k, v in row.phase_durations_seconds.items() if k in TIMED_PHASES},
        wall_seconds=row.wall_seconds,
        tokens={"input": row.input_tokens, "cached_input": row.cached_input_tokens, "output": row.output_tokens},
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
    return sorted((_task_row(row, suite) for row in ledger.rows.values()), key=lambda r: r.key)


def rows_from_suite(broker_url: str, suite: str, namespace: str | None = None) -> list[TaskRow]:
    """One row per task and attempt of a daemon suite, from its ledger on the broker.

    Raises:
        BrokerUnavailableError: the broker does not answer (exit 3).
        BadInputError: the suite name is not a safe label.
    """
    from runner.fleet.broker import DEFAULT_NAMESPACE
    from runner.tasks.protocol import check_suite
    from runner.fleet.views import rows_from_broker

    namespace = namespace or os.environ.get("RUNNER_FLEET_NAMESPACE", DEFAULT_NAMESPACE)
    return rows_from_broker(broker_url, check_suite(suite), namespace)
