"""The suite ledger: one Redis hash per suite, one field per (tag, arm, attempt), shared by every host.

Invariants:
- a row holds only public-safe facts (the status document passes the public guard);
- a field is changed only in a WATCH/MULTI transaction, so two hosts never lose
  each other's update; after ``queued`` only the lease holder writes a task's row;
- a final row (done, failed, cancelled) is never overwritten by a worker: only a
  resubmission of a failed or cancelled task takes it back to queued.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Literal

import redis
from pydantic import Field, ValidationError

from reducers.outcome import FINAL_STATES, FINISHED_STATES, TaskFacts, TaskState
from runner.fleet.broker import Keys
from runner.tasks.protocol import eval_key, task_key


ACTIVE_STATES = frozenset({TaskState.QUEUED, TaskState.RUNNING, TaskState.DONE})


class LedgerRow(TaskFacts):
    """A fleet unit's row: the facts every ledger shares (``reducers.outcome``) and its lifecycle.

    A unit is a task (an agent's run, keyed ``<tag>/<attempt>``, or ``<tag>/<arm>/<attempt>`` for an
    agent other than codex: ``runner.tasks.protocol.task_arm``) or an evaluation unit (one patch
    scored, keyed ``<tag>/<patch name>`` with its sha256, and its ``evaluate`` row in ``evaluation``).
    """

    kind: Literal["task", "eval"] = "task"
    tag: str
    attempt: int
    arm: str | None = None  # the agent, when not codex: one suite holds both agents' attempts of a tag
    patch: str | None = None  # an evaluation unit's patch name
    evaluation: dict[str, Any] | None = None  # its runner.score_patches.EvalRow, once scored
    queue: str
    host: str | None = None
    phase: str | None = None
    retries: int = 0
    error: str | None = Field(None, max_length=500)
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def key(self) -> str:
        return eval_key(self.tag, self.patch or "") if self.kind == "eval" else task_key(self.tag, self.attempt, self.arm)


class SuiteLedger:
    def __init__(self, client: redis.Redis, keys: Keys, suite: str) -> None:
        self._client = client
        self._keys = keys
        self.suite = suite
        self.key = keys.ledger(suite)

    def rows(self) -> list[LedgerRow]:
        rows = []
        for raw in self._client.hgetall(self.key).values():
            try:
                rows.append(LedgerRow.model_validate_json(raw))
            except ValidationError:
                continue  # a row of another version: status says nothing rather than crash
        return sorted(rows, key=lambda row: (row.kind, row.tag, row.arm or "", row.attempt, row.patch or ""))

    def get(self, key: str) -> LedgerRow | None:
        raw = self._client.hget(self.key, key)
        return LedgerRow.model_validate_json(raw) if raw else None

    def update(self, key: str, change: Callable[[LedgerRow | None], LedgerRow | None]) -> LedgerRow | None:
        """Apply ``change`` to the row atomically; ``None`` from it leaves the row as it is."""
        with self._client.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(self.key)
                    raw = pipe.hget(self.key, key)
                    current = LedgerRow.model_validate_json(raw) if raw else None
                    new = change(current)
                    if new is None:
                        pipe.unwatch()
                        return None
                    pipe.multi()
                    pipe.hset(self.key, key, new.model_dump_json())
                    pipe.sadd(self._keys.suites, self.suite)
                    pipe.execute()
                    return new
                except redis.WatchError:
                    continue

    def set_fields(self, key: str, *, unless_final: bool = True, **fields: Any) -> LedgerRow | None:
        """Change some fields of an existing row (never of a final one, unless told)."""

        def change(row: LedgerRow | None) -> LedgerRow | None:
            if row is None or (unless_final and row.state in FINAL_STATES):
                return None
            return row.model_copy(update=fields)

        return self.update(key, change)


def now() -> float:
    return round(time.time(), 3)


def summary(rows: list[LedgerRow]) -> dict[str, Any]:
    """Totals and the resolved rate, over the finished tasks and over the scored ones.

    The rates count finished tasks (done or failed); ``without_infra`` counts the scored
    ones only (done: the agent had its say), leaving out the tasks a host, its Docker,
    the model provider or a refused input ended (``reducers.outcome``).
    """
    states = Counter(row.state.value for row in rows)
    finished = [row for row in rows if row.state in FINISHED_STATES]
    infra = [row for row in finished if row.infra_failure]
    resolved = sum(1 for row in finished if row.resolved)
    scored = sum(1 for row in finished if row.scored)
    phase_seconds: Counter[str] = Counter()
    for row in finished:
        phase_seconds.update(row.phase_durations_seconds)
    return {
        "tasks": len(rows),
        "states": dict(sorted(states.items())),
        "resolved": resolved,
        "finished": len(finished),
        "infra_failures": len(infra),
        "resolved_rate": round(resolved / len(finished), 4) if finished else 0.0,
        "resolved_rate_without_infra": round(resolved / scored, 4) if scored else 0.0,
        "failures_by_label": dict(sorted(Counter(
            row.failure_label or row.state.value for row in finished if not row.resolved
        ).items())),
        "retries": sum(row.retries for row in rows),
        "wall_seconds": round(sum(row.wall_seconds or 0 for row in finished), 3),
        "phase_seconds": {k: round(v, 3) for k, v in sorted(phase_seconds.items())},
        "input_tokens": sum(row.input_tokens for row in rows),
        "output_tokens": sum(row.output_tokens for row in rows),
    }
