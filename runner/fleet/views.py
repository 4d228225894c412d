"""The daemon's side of the suite views (issue 13): a worker's state and the suite ledger as a
``StatusSource`` for ``runner.views`` (``worker --http``, ``report --suite --broker``).

Invariant: only the ledger's public fields and the worker's own counters are read; every
string shown still passes the views' public guard.
"""

from __future__ import annotations

import redis

from reducers.costs import BudgetFigures
from reducers.models import Phase
from reducers.outcome import FINISHED_STATES
from runner.fleet.broker import Keys, connect_redis
from runner.fleet.budget import FleetBudget
from runner.fleet.ledger import LedgerRow, SuiteLedger, TaskState
from runner.views.model import TIMED_PHASES, HealthReport, HostCheck, TaskRow


def task_row(suite: str, row: LedgerRow) -> TaskRow:
    """A suite ledger row as the views' row (the same states; phases and tokens by their kinds)."""
    known = {p.value for p in Phase}
    where = row.phase if row.state is TaskState.RUNNING else row.first_failed_phase  # now, or where it stopped
    phase = Phase(where) if where in known else None
    return TaskRow(
        suite=suite,
        kind=row.kind,
        tag=row.tag,
        attempt=row.attempt,
        patch=row.patch,
        state=row.state,
        host=row.host,
        phase=phase,
        resolved=row.resolved,
        infra_failure=row.infra_failure if row.state in FINISHED_STATES else None,
        failure_label=row.failure_label,
        phase_seconds={k: v for k, v in row.phase_durations_seconds.items() if k in TIMED_PHASES and v >= 0},
        wall_seconds=row.wall_seconds,
        tokens={"input": row.input_tokens, "cached_input": row.cached_input_tokens, "output": row.output_tokens},
        cost_usd=row.cost_usd,
        # a task row without an arm is codex's by construction (runner.tasks.protocol.task_arm), run or not
        agent=row.agent or row.arm or ("codex" if row.kind == "task" else None),
        image=row.image_digest or row.image_id,
    )


def suite_rows(client: redis.Redis, keys: Keys, suites: list[str] | None = None) -> list[TaskRow]:
    """Every task row of the named suites (all the broker knows of, by default)."""
    names = suites if suites is not None else sorted(name.decode() for name in client.smembers(keys.suites))
    return [task_row(suite, row) for suite in names for row in SuiteLedger(client, keys, suite).rows()]


def suite_from_broker(broker_url: str, suite: str, namespace: str) -> tuple[list[TaskRow], BudgetFigures | None]:
    """A suite's rows and, when it has one, its budget with what its running tasks have spent so far."""
    client = connect_redis(broker_url)
    try:
        keys = Keys(namespace)
        budget = FleetBudget(client, keys, ttl=0)
        limit = budget.limit(suite)
        figures = BudgetFigures(limit_usd=limit, running_usd=budget.running_usd(suite)) if limit is not None else None
        return suite_rows(client, keys, [suite]), figures
    finally:
        client.close()


class WorkerStatusSource:
    """``StatusSource`` of a running worker: its host checks and slots, and every suite's rows."""

    def __init__(self, state, client: redis.Redis, keys: Keys) -> None:  # state: runner.fleet.worker.WorkerState
        self._state = state
        self._client = client
        self._keys = keys

    def health(self) -> HealthReport:
        state = self._state
        checks = [HostCheck(name=check.name, ok=check.ok, detail=check.detail) for check in state.checks()]
        checks.append(HostCheck(name="broker", ok=state.broker_ok, detail="answers" if state.broker_ok else "unreachable"))
        return HealthReport(
            checks=checks, taking_work=state.accepting(), draining=state.draining,
            slots_busy=state.busy, slots_total=state.slots,
        )

    def rows(self) -> list[TaskRow]:
        try:
            return suite_rows(self._client, self._keys)
        except redis.RedisError:
            return []  # the broker check says why; the page still answers
