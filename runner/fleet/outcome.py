"""What a worker does with a finished task: its row (the one rule), and done, requeue or retry.

Invariants:
- a task's facts come from ``reducers.outcome.task_facts``, as a batch's do: the fleet
  scores a task exactly as a single run and a batch would;
- an agent's failure is scored and never retried; a refused input is failed and never
  retried; an infrastructure failure goes back to the queue while retries are left;
- a task this worker stopped itself (a drain, a lost lease) goes back to the queue as it
  was, and a cancelled one ends ``cancelled``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

import redis
import structlog

from reducers.compact import BenchmarkRun
from reducers.outcome import EXIT_INTERRUPTED, FINAL_STATES, TaskFacts, TaskState, task_facts
from runner.fleet.broker import Keys
from runner.fleet.ledger import LedgerRow, SuiteLedger, now
from runner.fleet.outbox import Outbox
from runner.tasks.protocol import EvalMessage, TaskMessage

Unit = TaskMessage | EvalMessage

log = structlog.get_logger(__name__)


class StopReason(str, Enum):
    DRAIN = "drain"
    CANCEL = "cancel"
    LEASE_LOST = "lease_lost"


class Action(str, Enum):
    DONE = "done"  # the message is finished with (acked)
    REQUEUE = "requeue"  # put back as it was: this worker stopped it, no retry is spent
    RETRY = "retry"  # an infrastructure failure: Dramatiq's retry, after the backoff


@dataclass(frozen=True)
class Decision:
    action: Action
    facts: TaskFacts  # what the task's row says now (queued again, for a requeue or a retry)
    retries: int  # the row's retry count after this decision

    @property
    def final(self) -> bool:
        return self.action is Action.DONE


def decide(
    run: BenchmarkRun | None,
    exit_code: int | None,
    wall_seconds: float,
    *,
    stop_reason: StopReason | None,
    retries: int,
    max_retries: int,
) -> Decision:
    """The fleet's policy for a task whose process ended with ``exit_code`` having written ``run``."""
    if exit_code == EXIT_INTERRUPTED and stop_reason in (StopReason.DRAIN, StopReason.LEASE_LOST):
        return Decision(Action.REQUEUE, TaskFacts(state=TaskState.QUEUED, exit_code=exit_code), retries)
    facts = task_facts(run, exit_code, wall_seconds, stopping=stop_reason is not None)
    if facts.state is TaskState.CANCELLED and stop_reason is None:
        # Interrupted by no one's request here (the host shutting down, say): the host's failure.
        facts = facts.model_copy(update={"state": TaskState.FAILED, "infra_failure": True,
                                         "failure_label": facts.failure_label or "interrupted"})
    return infra_retry(facts, retries, max_retries) if facts.infra_failure else Decision(Action.DONE, facts, retries)


def infra_retry(facts: TaskFacts, retries: int, max_retries: int) -> Decision:
    """An infrastructure failure: queued again while retries are left, else failed for good."""
    if retries < max_retries:
        queued = facts.model_copy(update={"state": TaskState.QUEUED, "wall_seconds": None})
        return Decision(Action.RETRY, queued, retries + 1)
    return Decision(Action.DONE, facts.model_copy(update={"state": TaskState.FAILED}), retries)


def decide_evaluation(
    row: dict | None, exit_code: int | None, wall_seconds: float, *, stop_reason: StopReason | None, retries: int,
    max_retries: int,
) -> Decision:
    """The fleet's policy for an evaluation unit whose process ended with ``exit_code`` having scored ``row``
    (a ``runner.score_patches.EvalRow``, or None: it never got that far, and the task rule decides).

    Its states become the task states: scored or rejected is done (the patch's verdict, never retried); a
    refused tag (unscorable) is failed, not counted; an infrastructure failure is retried as a task's is.
    """
    from runner.score_patches import EvalRow, UnitState

    if row is None:
        return decide(None, exit_code, wall_seconds, stop_reason=stop_reason, retries=retries, max_retries=max_retries)
    scored = EvalRow.model_validate(row)
    common = {"exit_code": exit_code, "wall_seconds": wall_seconds, "patch_sha256": scored.patch_sha256,
              "patch_bytes": scored.patch_bytes, "image_id": scored.image_id, "image_digest": scored.image_digest}
    if scored.state is UnitState.INFRA_FAILED:
        # "docker_error: APIError" -> "docker_error": a label from the closed set the views show
        label = re.sub(r"[^a-z0-9_]", "_", (scored.label or "infra_failed").split(":")[0].lower())[:128]
        facts = TaskFacts(state=TaskState.FAILED, failure_label=label, infra_failure=True, **common)
        return infra_retry(facts, retries, max_retries)
    if scored.state is UnitState.UNSCORABLE:
        return Decision(Action.DONE, TaskFacts(state=TaskState.FAILED, failure_label="unscorable", **common), retries)
    facts = TaskFacts(state=TaskState.DONE, resolved=scored.resolved, failure_label=scored.label,
                      exit_code_verdict=scored.exit_code_verdict, verdict_untrusted=scored.verdict_untrusted, **common)
    return Decision(Action.DONE, facts, retries)


def identity(task: Unit) -> dict:
    """The fields that name a unit's row: a task's (tag, arm, attempt), an evaluation unit's (tag, patch)."""
    if isinstance(task, EvalMessage):
        return {"kind": "eval", "tag": task.tag, "attempt": task.attempt, "patch": task.unit.name}
    return {"tag": task.tag, "attempt": task.attempt, "arm": task.arm}


def not_started(label: str, retries: int, max_retries: int, agent: str | None = None) -> Decision:
    """The task could not be started on this host (its job root or log could not be written, its agent
    is not there); ``agent``: the one it names, for its row."""
    facts = TaskFacts(state=TaskState.FAILED, failure_label=label, infra_failure=True, agent=agent)
    return infra_retry(facts, retries, max_retries)


class Recorder:
    """A decision's row in the suite ledger, written the one way for every task of this worker.

    Retries and requeues go back to ``queued``; a final row is kept in the outbox first,
    so that a broker gone at that instant costs time, never the verdict.
    """

    def __init__(self, client: redis.Redis, keys: Keys, outbox: Outbox, host: str) -> None:
        self._client, self._keys, self._outbox, self._host = client, keys, outbox, host

    def ledger(self, suite: str) -> SuiteLedger:
        return SuiteLedger(self._client, self._keys, suite)

    def running(self, task: Unit, queue: str, retries: int) -> None:
        def change(row: LedgerRow | None) -> LedgerRow:
            base = row or LedgerRow(**identity(task), state=TaskState.QUEUED, queue=queue, submitted_at=now())
            return base.model_copy(update={
                "state": TaskState.RUNNING, "host": self._host, "phase": None, "queue": queue,
                "started_at": now(), "finished_at": None, "retries": retries, "exit_code": None,
            })

        self.ledger(task.suite).update(task.key, change)

    def record(self, task: Unit, queue: str, decision: Decision, evaluation: dict | None = None) -> LedgerRow | None:
        facts = decision.facts
        if not decision.final:
            return self.ledger(task.suite).set_fields(
                task.key, **facts.model_dump(exclude={"wall_seconds"}), host=None, phase=None, retries=decision.retries)
        final = LedgerRow(**identity(task), queue=queue, host=self._host, retries=decision.retries,
                          submitted_at=now(), finished_at=now(), evaluation=evaluation, **facts.model_dump())
        try:
            self._outbox.keep(task.suite, final)
        except OSError:
            log.error("outbox_not_written", reason="the jobs dir cannot be written")
        return self._deliver(task.suite, final)

    def _deliver(self, suite: str, final: LedgerRow) -> LedgerRow | None:
        """A final row into the ledger (keeping the row's submission); kept on this host while the broker is gone."""

        def change(row: LedgerRow | None) -> LedgerRow:
            return final if row is None else final.model_copy(update={
                "submitted_at": row.submitted_at, "started_at": row.started_at, "queue": row.queue})

        try:
            written = self.ledger(suite).update(final.key, change)
        except redis.RedisError:
            log.error("ledger_not_written", reason="broker unreachable", kept_until="the broker answers again")
            return final
        self._outbox.delivered(suite, final)
        return written

    def redeliver_kept(self) -> int:
        """Every kept row, once the broker answers: written unless the ledger already holds a final one.

        Raises:
            redis.RedisError: the broker is still gone (the rows stay kept).
        """
        def deliver(suite: str, final: LedgerRow) -> None:
            self.ledger(suite).update(final.key, lambda row: None if row is not None and row.state in FINAL_STATES else final)

        return self._outbox.flush(deliver)
