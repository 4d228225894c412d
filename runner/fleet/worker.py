"""``python -m runner worker``: the daemon of one trusted host, a Dramatiq worker on the fleet's Redis.

Invariants:
- the unit of work is the same isolated task process as the batch's, started by
  the supervisor (``runner.supervisor.run_task``): a child in its own session, its own
  job root ``<jobs>/<suite>/<tag>/attempt-<i>``, its markers, its labelled
  containers; the child gets SIGTERM if this worker dies (no run outlives it);
- at most ``--slots`` tasks at once (Dramatiq threads and prefetch = slots), and
  none taken while a host check fails or the worker drains;
- a task runs only under its lease; its ledger row is written by the lease holder;
- the first SIGTERM drains (running tasks finish, none is taken); a second one, or
  ``--grace`` seconds, interrupts them through the child's cleanup and puts their
  messages back on the queue, where a restarted worker resumes them from markers;
- nothing a message holds can crash the worker: a bad one becomes a failed row.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import FrameType
from typing import Any

import dramatiq
import redis
import structlog
from dramatiq.errors import Retry
from dramatiq.middleware import CurrentMessage
from structlog.contextvars import bound_contextvars

from reducers.compact import BenchmarkRun
from runner.atomic import write_bytes_atomic
from runner.fleet.views import WorkerStatusSource
from runner.views.server import BackgroundServer, http_address
from runner.docker_utils import connect, sweep_strays
from runner.errors import BadInputError, EnvironmentNotReadyError, ExitCode, REFUSALS, exit_code_of
from runner.fleet.broker import (
    DEFAULT_INFRA_RETRIES,
    DEFAULT_NAMESPACE,
    TIME_LIMIT_MS,
    Keys,
    connect_redis,
    make_broker,
)
from runner.fleet.hostchecks import HostReport, check_host
from runner.fleet.leases import Lease
from runner.fleet.ledger import FINAL_STATES, LedgerRow, SuiteLedger, TaskState, now
from runner.fleet.messages import (
    ACTOR_NAME,
    DEFAULT_QUEUE,
    SAFE_SUITE,
    MessageError,
    TaskMessage,
    check_queue,
    parse_message,
)
from runner.jobroot import PROMPT
from runner.logs import configure_logging
from runner.settings import SAFE_HOST_PATH, SAFE_TAG, is_safe_tag, load_settings
from runner.supervisor import run_task
from runner.task import host_settings, task_spec

log = structlog.get_logger(__name__)

WORKER_LOGS = ".worker-logs"
REJECTED_SUITE = "_rejected"  # where a message whose suite name is unsafe gets its failed row
SHUTDOWN_TIMEOUT_MS = 30_000  # Dramatiq's threads are idle by then: the drain waited for the tasks
# First failure reasons of a run that are the host's fault, not the agent's (exit 1 of a child).
INFRA_REASONS = frozenset({"docker_error", "os_error", "git_error", "internal_error", "job_root_unwritable"})


class StopReason(str, Enum):
    DRAIN = "drain"
    CANCEL = "cancel"
    LEASE_LOST = "lease_lost"


class Action(str, Enum):
    DONE = "done"
    REQUEUE = "requeue"
    RETRY = "retry"


class RunningTask:
    """One task in a slot: its child process, its phase, and why it is being stopped (if it is)."""

    def __init__(self, task: TaskMessage, lease: Lease) -> None:
        self.task = task
        self.lease = lease
        self.phase: str | None = None
        self.started_at = now()
        self.stop_reason: StopReason | None = None
        self._child: Any = None
        self._lock = threading.Lock()

    # ChildRegistry, for runner.supervisor.run_task
    def add(self, child: Any) -> None:
        with self._lock:
            self._child = child
            if self.stop_reason is not None:
                child.send_signal(signal.SIGTERM)

    def discard(self, child: Any) -> None:
        with self._lock:
            self._child = None

    def interrupt(self, reason: StopReason) -> None:
        """SIGTERM to the child: the same cleanup path as Ctrl-C (containers removed, marker written)."""
        with self._lock:
            if self.stop_reason is None:
                self.stop_reason = reason
            if self._child is not None and self._child.poll() is None:
                self._child.send_signal(signal.SIGTERM)

    def snapshot(self) -> dict[str, Any]:
        return {
            "suite": self.task.suite, "tag": self.task.tag, "attempt": self.task.attempt,
            "phase": self.phase, "started_at": self.started_at,
            "seconds": round(max(0.0, time.time() - self.started_at), 1),
            "stopping": self.stop_reason.value if self.stop_reason else None,
        }


class WorkerState:
    """What the worker knows about itself, for an HTTP server (issue 13) or a test to read.

    Thread-safe. ``snapshot()`` is a JSON-ready dict; ``add_listener(fn)`` calls ``fn(event,
    payload)`` for ``task_started``/``task_phase`` (payload: the task's snapshot) and
    ``task_finished`` (payload: its ``LedgerRow``), from the task's thread.
    """

    def __init__(self, name: str, slots: int, queues: list[str]) -> None:
        self.name = name
        self.slots = slots
        self.queues = list(queues)
        self.started_at = now()
        self.draining = False
        self.broker_ok = True
        self.host: HostReport | None = None
        self.checked_at: float | None = None
        self.finished: dict[str, int] = {}
        self._running: dict[str, RunningTask] = {}
        self._listeners: list[Callable[[str, Any], None]] = []
        self._lock = threading.Lock()

    @property
    def healthy(self) -> bool:
        return self.host is not None and self.host.healthy

    def accepting(self) -> bool:
        """The gate of the consumers: take a message only when this is true."""
        return self.healthy and not self.draining and self.broker_ok

    @property
    def busy(self) -> int:
        with self._lock:
            return len(self._running)

    def running(self) -> list[RunningTask]:
        with self._lock:
            return list(self._running.values())

    def add_listener(self, listener: Callable[[str, Any], None]) -> None:
        self._listeners.append(listener)

    def emit(self, event: str, payload: Any) -> None:
        for listener in list(self._listeners):
            try:
                listener(event, payload)
            except Exception:  # a broken view must never stop a task
                log.exception("worker_listener_failed", listener_event=event)

    def set_host(self, report: HostReport) -> None:
        self.host, self.checked_at = report, now()

    def start_task(self, key: str, task: RunningTask) -> None:
        with self._lock:
            self._running[key] = task
        self.emit("task_started", task.snapshot())

    def set_phase(self, task: RunningTask, phase: str) -> None:
        task.phase = phase
        self.emit("task_phase", task.snapshot())

    def finish_task(self, key: str, row: LedgerRow | None) -> None:
        with self._lock:
            self._running.pop(key, None)
            if row is not None:
                self.finished[row.state.value] = self.finished.get(row.state.value, 0) + 1
        if row is not None:
            self.emit("task_finished", row)

    def snapshot(self) -> dict[str, Any]:
        running = [task.snapshot() for task in self.running()]
        return {
            "name": self.name,
            "queues": self.queues,
            "slots": self.slots,
            "busy": len(running),
            "free": max(0, self.slots - len(running)),
            "draining": self.draining,
            "healthy": self.healthy,
            "accepting": self.accepting(),
            "broker_ok": self.broker_ok,
            "checked_at": self.checked_at,
            "checks": [check.model_dump() for check in (self.host.checks if self.host else [])],
            "started_at": self.started_at,
            "finished": dict(self.finished),
            "tasks": running,
        }


@dataclass
class WorkerOptions:
    broker: str
    jobs_dir: Path
    slots: int = 1
    queues: list[str] = field(default_factory=lambda: [DEFAULT_QUEUE])
    namespace: str = DEFAULT_NAMESPACE
    name: str = field(default_factory=socket.gethostname)
    codex_bin: str = "codex"
    heartbeat_timeout: float = 60.0
    grace: float | None = None
    min_free_gb: float = 5.0
    check_interval: float = 30.0
    max_infra_retries: int = DEFAULT_INFRA_RETRIES
    retry_backoff: float = 15.0
    http: str | None = None  # HOST:PORT of the views (/healthz, /metrics, /); off by default

    def validate(self) -> None:
        if not 1 <= self.slots <= 64:
            raise BadInputError("--slots must be between 1 and 64")
        for queue in self.queues:
            check_queue(queue)
        if not SAFE_TAG.fullmatch(self.name):
            raise BadInputError("--name must be letters, digits, '_', '.' or '-' (it is shown as the task's host)")
        if self.heartbeat_timeout < 1 or self.check_interval <= 0 or self.retry_backoff <= 0:
            raise BadInputError("--heartbeat-timeout must be at least 1 s; --check-interval and --retry-backoff above 0")
        if not 0 <= self.max_infra_retries <= 20:
            raise BadInputError("--max-infra-retries must be between 0 and 20")
        self.jobs_dir = self.jobs_dir.expanduser().resolve()
        if not SAFE_HOST_PATH.fullmatch(str(self.jobs_dir)):
            raise BadInputError("--jobs-dir must be a path of letters, digits and '_ . @ + / ~ -', without spaces")
        if not self.jobs_dir.is_dir():
            raise BadInputError("--jobs-dir does not exist; create it first")
        if self.http is not None:
            http_address(self.http)  # refuses a malformed address before anything starts


class FleetWorker:
    def __init__(self, options: WorkerOptions) -> None:
        options.validate()
        self.options = options
        self.keys = Keys(options.namespace)
        self.redis = connect_redis(options.broker)
        self.state = WorkerState(options.name, options.slots, options.queues)
        self.lease_ttl = options.heartbeat_timeout
        self._stop = threading.Event()
        self._recheck = threading.Event()
        self.broker = make_broker(
            options.broker, options.namespace, heartbeat_timeout=options.heartbeat_timeout,
            gate=self.state.accepting, max_infra_retries=options.max_infra_retries,
            retry_backoff=options.retry_backoff, retry_when=lambda _n, error: isinstance(error, Retry),
        )
        self.actor = dramatiq.actor(
            self._handle, broker=self.broker, actor_name=ACTOR_NAME, queue_name=options.queues[0],
            time_limit=TIME_LIMIT_MS, max_retries=options.max_infra_retries,
        )
        for queue in options.queues:
            self.broker.declare_queue(queue)

    # -- the actor -------------------------------------------------------------------------

    def _handle(self, payload: Any) -> None:
        """The actor: a thin call into one isolated run; never raises but to retry an infra failure."""
        current = CurrentMessage.get_current_message()
        retries = int(current.options.get("retries", 0)) if current is not None else 0
        queue = current.queue_name if current is not None else self.options.queues[0]
        queue = queue.removesuffix(".DQ")
        try:
            task = parse_message(payload)
        except MessageError as e:
            self._reject(payload, e, queue, current.message_id if current is not None else uuid.uuid4().hex)
            return
        with bound_contextvars(suite=task.suite, task=task.key):
            action = self._take(task, queue, retries)
        if current is None:
            return
        if action is Action.REQUEUE:
            self.broker.enqueue(current.copy(queue_name=queue))
        elif action is Action.RETRY:
            raise Retry(f"infrastructure failure of {task.suite}/{task.key}")

    def _take(self, task: TaskMessage, queue: str, retries: int) -> Action:
        ledger = SuiteLedger(self.redis, self.keys, task.suite)
        row = ledger.get(task.key)
        if row is not None and row.state in FINAL_STATES:
            log.info("duplicate_dropped", state=row.state.value)
            return Action.DONE
        if self.state.draining:
            log.info("task_given_back", reason="draining")
            return Action.REQUEUE
        if self.redis.sismember(self.keys.cancelled(task.suite), task.key):
            ledger.set_fields(task.key, state=TaskState.CANCELLED, finished_at=now())
            log.info("task_cancelled", reason="cancelled before it started")
            return Action.DONE
        lease = Lease(self.redis, self.keys.lease(task.suite, task.key), f"{self.options.name}:{uuid.uuid4().hex[:8]}",
                      self.lease_ttl)
        if not lease.acquire():
            # Another delivery of this task runs (or its dead holder's lease has not expired yet):
            # look again later, so that the task is neither run twice nor lost.
            log.info("duplicate_deferred", delay_seconds=round(self.lease_ttl / 2, 1))
            self.broker.enqueue(CurrentMessage.get_current_message().copy(queue_name=queue),
                                delay=int(self.lease_ttl * 500))
            return Action.DONE
        running = RunningTask(task, lease)
        key = f"{task.suite}/{task.key}"
        row = None
        try:
            self.state.start_task(key, running)
            row, action = self._run(task, running, ledger, queue, retries)
            return action
        finally:
            self.state.finish_task(key, row)
            try:
                lease.release()
            except redis.RedisError:
                pass  # it expires on its own

    def _run(
        self, task: TaskMessage, running: RunningTask, ledger: SuiteLedger, queue: str, retries: int
    ) -> tuple[LedgerRow | None, Action]:
        job_root = self.options.jobs_dir / task.suite / task.tag / f"attempt-{task.attempt}"
        try:
            settings = load_settings(job_root=job_root, codex_bin=self.options.codex_bin, **task.settings_overrides())
        except BadInputError as e:
            return self._finish(ledger, task, queue, TaskState.FAILED, retries, failure_label="bad_input",
                                error=str(e), exit_code=int(ExitCode.BAD_INPUT)), Action.DONE
        started = time.monotonic()
        try:
            write_bytes_atomic(job_root / PROMPT, task.prompt.encode(), mode=0o600)
        except OSError as e:
            return self._infra(ledger, task, queue, retries, "job_root_unwritable",
                               f"the job root cannot be written ({e.strerror or type(e).__name__})", None, None, 0.0)
        ledger.update(task.key, lambda row: self._running_row(row, task, queue, retries))
        log.info("task_started", host=self.options.name, retries=retries)

        def on_phase(phase: str) -> None:
            self.state.set_phase(running, phase)
            try:
                ledger.set_fields(task.key, phase=phase)
            except redis.RedisError:
                log.warning("ledger_not_written", reason="broker unreachable")

        log_path = self.options.jobs_dir / task.suite / WORKER_LOGS / f"{task.tag}.attempt-{task.attempt}.log"
        try:
            spec = task_spec(settings, task.tag, job_root, image=settings.image, attempt=task.attempt)
            end = run_task(spec, host_settings(settings), log_path, running, on_phase)
        except OSError as e:  # the task could not even start (no space for its log, say)
            return self._infra(ledger, task, queue, retries, "task_not_started",
                               f"the task process could not start ({type(e).__name__})", None, None, 0.0)
        wall = round(time.monotonic() - started, 3)
        exit_code, run = end.returncode, (end.outcome.run if end.outcome is not None else None)
        reason = running.stop_reason
        log.info("task_exited", exit_code=exit_code, stop_reason=reason.value if reason else None, wall_seconds=wall)
        facts = _facts(run, exit_code, wall)
        if exit_code == ExitCode.INTERRUPTED and reason is StopReason.CANCEL:
            return self._finish(ledger, task, queue, TaskState.CANCELLED, retries, **facts), Action.DONE
        if exit_code == ExitCode.INTERRUPTED and reason in (StopReason.DRAIN, StopReason.LEASE_LOST):
            row = ledger.set_fields(task.key, state=TaskState.QUEUED, host=None, phase=None, exit_code=exit_code)
            log.info("task_given_back", reason=reason.value)
            return row, Action.REQUEUE
        if exit_code == ExitCode.COMPLETED:
            return self._finish(ledger, task, queue, TaskState.DONE, retries, **facts), Action.DONE
        if exit_code == ExitCode.BAD_INPUT:
            facts["failure_label"] = facts.get("failure_label") or "bad_input"
            return self._finish(ledger, task, queue, TaskState.FAILED, retries, **facts), Action.DONE
        failure_reason = run.first_failure_reason if run else None
        if exit_code == ExitCode.RUNNER_FAILURE and run is not None and failure_reason not in INFRA_REASONS:
            # The agent's failure (codex failed or timed out, empty patch, ...): scored, never retried.
            return self._finish(ledger, task, queue, TaskState.DONE, retries, **facts), Action.DONE
        label = facts.get("failure_label") or f"exit_{exit_code}"
        return self._infra(ledger, task, queue, retries, label, None, exit_code, run, wall)

    def _infra(
        self, ledger: SuiteLedger, task: TaskMessage, queue: str, retries: int, label: str,
        error: str | None, exit_code: int | None, run: BenchmarkRun | None, wall: float,
    ) -> tuple[LedgerRow | None, Action]:
        """An infrastructure failure: back to the queue while retries are left, else failed."""
        self._recheck.set()  # the host may be what broke: look before taking anything else
        facts = {**_facts(run, exit_code, wall), "failure_label": label, "infra_failure": True, "error": error}
        if retries < self.options.max_infra_retries:
            row = ledger.set_fields(task.key, state=TaskState.QUEUED, host=None, phase=None, retries=retries + 1,
                                    **{k: v for k, v in facts.items() if k != "wall_seconds"})
            log.warning("task_infra_failure", failure_label=label, retry=retries + 1,
                        max_retries=self.options.max_infra_retries)
            return row, Action.RETRY
        log.error("task_infra_failure", failure_label=label, retries_exhausted=True)
        return self._finish(ledger, task, queue, TaskState.FAILED, retries, **facts), Action.DONE

    def _running_row(self, row: LedgerRow | None, task: TaskMessage, queue: str, retries: int) -> LedgerRow:
        base = row or LedgerRow(tag=task.tag, attempt=task.attempt, state=TaskState.QUEUED, queue=queue,
                                submitted_at=now())
        return base.model_copy(update={
            "state": TaskState.RUNNING, "host": self.options.name, "phase": None, "queue": queue,
            "started_at": now(), "finished_at": None, "retries": retries, "exit_code": None,
        })

    def _finish(self, ledger: SuiteLedger, task: TaskMessage, queue: str, state: TaskState, retries: int,
                **facts: Any) -> LedgerRow | None:
        def change(row: LedgerRow | None) -> LedgerRow:
            base = row or LedgerRow(tag=task.tag, attempt=task.attempt, state=state, queue=queue, submitted_at=now())
            return base.model_copy(update={"state": state, "host": self.options.name, "phase": None,
                                           "retries": retries, "finished_at": now(), **facts})

        row = ledger.update(task.key, change)
        log.info("task_finished", state=state.value, resolved=facts.get("resolved"),
                 failure_label=facts.get("failure_label"))
        return row

    def _reject(self, payload: Any, error: MessageError, queue: str, message_id: str) -> None:
        """A message that cannot become a task: a failed row where the operator will look for it."""
        fields = payload if isinstance(payload, dict) else {}
        suite = fields.get("suite")
        suite = suite if isinstance(suite, str) and SAFE_SUITE.fullmatch(suite) and ".." not in suite else REJECTED_SUITE
        tag = fields.get("tag")
        attempt = fields.get("attempt")
        attempt = attempt if isinstance(attempt, int) and not isinstance(attempt, bool) and 1 <= attempt <= 100 else 1
        if not (isinstance(tag, str) and is_safe_tag(tag)) or suite == REJECTED_SUITE:
            tag = f"invalid-{message_id.replace('-', '')[-12:]}"
        row = LedgerRow(tag=tag, attempt=attempt, state=TaskState.FAILED, queue=queue, host=self.options.name,
                        failure_label="bad_message", error=str(error)[:500], submitted_at=now(), finished_at=now())
        log.error("message_rejected", suite=suite, task=row.key, error=str(error)[:500])
        try:
            SuiteLedger(self.redis, self.keys, suite).update(
                row.key, lambda current: None if current is not None and current.state is TaskState.RUNNING else row
            )
        except redis.RedisError:
            log.error("ledger_not_written", reason="broker unreachable")

    # -- the daemon --------------------------------------------------------------------------

    def _check_host(self) -> None:
        report = check_host(self.options.jobs_dir, self.options.codex_bin, self.options.min_free_gb)
        was = self.state.host
        self.state.set_host(report)
        if not report.healthy:
            failing = report.failing()
            log.warning("host_unhealthy", taking_work=False, failing=[c.name for c in failing],
                        details=[c.detail for c in failing])
        elif was is None or not was.healthy:
            log.info("host_healthy", taking_work=not self.state.draining)

    def _host_loop(self) -> None:
        while not self._stop.is_set():
            self._recheck.wait(self.options.check_interval)
            self._recheck.clear()
            if self._stop.is_set():
                return
            try:
                self._check_host()
            except Exception:  # a check that breaks must not end the checking
                log.exception("host_check_failed")

    def _monitor_loop(self) -> None:
        """Heartbeats, lease renewals and cancel requests, every tick."""
        tick = max(0.2, min(1.0, self.lease_ttl / 4))
        while not self._stop.wait(tick):
            try:
                for queue in self.options.queues:
                    self.broker.do_qsize(queue)  # every broker call is a heartbeat of this worker
                for running in self.state.running():
                    task = running.task
                    if not running.lease.renew():
                        log.error("lease_lost", suite=task.suite, task=task.key)
                        running.interrupt(StopReason.LEASE_LOST)
                    elif self.redis.sismember(self.keys.cancelled(task.suite), task.key):
                        log.info("task_cancel_requested", suite=task.suite, task=task.key)
                        running.interrupt(StopReason.CANCEL)
                if not self.state.broker_ok:
                    log.info("broker_reachable_again")
                self.state.broker_ok = True
            except redis.RedisError as e:
                if self.state.broker_ok:
                    log.error("broker_unreachable", error_type=type(e).__name__, taking_work=False)
                self.state.broker_ok = False

    def _sweep(self) -> None:
        """Containers of this host's runs that died before this start (a crash, a power loss)."""
        try:
            client = connect(timeout=10)
        except EnvironmentNotReadyError:
            return  # the host check reports Docker
        try:
            removed, kept = sweep_strays(client)
        finally:
            client.close()
        log.info("stray_containers_swept", removed=removed, kept_live=kept)

    def _start_views(self) -> BackgroundServer | None:
        """``--http``: health, metrics and the status page of every suite, on a daemon thread."""
        if self.options.http is None:
            return None
        host, port = http_address(self.options.http)
        try:
            views = BackgroundServer(
                WorkerStatusSource(self.state, self.redis, self.keys), host, port,
                title=f"runner worker {self.options.name}",
                private_texts=[str(self.options.jobs_dir), self.options.broker],
                counted_host=self.options.name,
            ).__enter__()
        except OSError as e:
            raise BadInputError(f"--http {self.options.http}: cannot listen there ({e.strerror or type(e).__name__})") from e
        log.info("views_serving", address=self.options.http)
        return views

    def serve(self) -> int:
        """Run until drained; returns the exit code."""
        signals = {"count": 0}

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            signals["count"] += 1

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self._sweep()
        self._check_host()
        views = self._start_views()
        worker = dramatiq.Worker(self.broker, queues=set(self.options.queues), worker_threads=self.options.slots,
                                 worker_timeout=500)
        # Prefetch counts running messages: with one per slot, a busy host holds no message
        # another host could run now.
        worker.queue_prefetch = self.options.slots
        threads = [threading.Thread(target=target, name=name, daemon=True)
                   for target, name in ((self._host_loop, "host-checks"), (self._monitor_loop, "monitor"))]
        for thread in threads:
            thread.start()
        worker.start()
        log.info("worker_started", name=self.options.name, slots=self.options.slots, queues=self.options.queues,
                 heartbeat_timeout=self.options.heartbeat_timeout, taking_work=self.state.accepting())
        drain_started: float | None = None
        interrupted = False
        try:
            while True:
                if signals["count"] >= 1 and drain_started is None:
                    self.state.draining = True
                    drain_started = time.monotonic()
                    log.info("drain_started", running=self.state.busy, grace=self.options.grace)
                over_grace = (drain_started is not None and self.options.grace is not None
                              and time.monotonic() - drain_started >= self.options.grace)
                if (signals["count"] >= 2 or over_grace) and not interrupted:
                    interrupted = True
                    log.warning("drain_interrupting", running=self.state.busy)
                if interrupted:
                    for running in self.state.running():
                        running.interrupt(StopReason.DRAIN)
                if drain_started is not None and self.state.busy == 0:
                    break
                time.sleep(0.1)
        finally:
            self.state.draining = True
            worker.stop(timeout=SHUTDOWN_TIMEOUT_MS)
            self._stop.set()
            self._recheck.set()
            try:  # a worker that stopped cleanly holds no message: it leaves no heartbeat behind
                self.redis.zrem(f"{self.keys.dramatiq}:__heartbeats__", self.broker.broker_id)
            except redis.RedisError:
                pass
            self.broker.close()
            if views is not None:
                views.__exit__(None, None, None)
        log.info("worker_stopped", finished=self.state.finished)
        print(json.dumps({"mode": "worker", "name": self.options.name, "finished": self.state.finished,
                          "interrupted": interrupted}, sort_keys=True))
        return int(ExitCode.COMPLETED)


def _facts(run: BenchmarkRun | None, exit_code: int | None, wall: float) -> dict[str, Any]:
    facts: dict[str, Any] = {"exit_code": exit_code, "wall_seconds": wall}
    if run is None:
        return facts
    return {
        **facts,
        "resolved": run.official_task_score.resolved,
        "first_failed_phase": run.first_failed_phase,
        "failure_label": None if run.official_task_score.resolved else run.score_failure_attribution,
        "phase_durations_seconds": run.phase_durations_seconds,
        "input_tokens": run.metrics.input_tokens,
        "cached_input_tokens": run.metrics.cache_tokens,
        "output_tokens": run.metrics.output_tokens,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m runner worker",
                                     description="The runner daemon: take tasks from the fleet's queue and run them.")
    parser.add_argument("--broker", required=True, help="redis://HOST:PORT/DB")
    parser.add_argument("--jobs-dir", type=Path, required=True, help="job roots go to DIR/<suite>/<tag>/attempt-<i>")
    parser.add_argument("--slots", type=int, default=1, help="tasks run at once (default 1)")
    parser.add_argument("--queue", action="append", dest="queues", help=f"queue to take from (repeatable; default {DEFAULT_QUEUE})")
    parser.add_argument("--heartbeat-timeout", type=float, default=60.0, metavar="SECONDS",
                        help="a worker silent this long is dead: its tasks go back to the queue (default 60)")
    parser.add_argument("--grace", type=float, metavar="SECONDS",
                        help="after the first SIGTERM, interrupt running tasks after this long (default: wait)")
    parser.add_argument("--min-free-gb", type=float, default=5.0, help="free disk wanted on the jobs dir and Docker's data root")
    parser.add_argument("--check-interval", type=float, default=30.0, metavar="SECONDS", help="host checks (default 30)")
    parser.add_argument("--max-infra-retries", type=int, default=DEFAULT_INFRA_RETRIES,
                        help=f"requeues of a task failed by infrastructure (default {DEFAULT_INFRA_RETRIES}); agent failures never")
    parser.add_argument("--retry-backoff", type=float, default=15.0, metavar="SECONDS", help="first retry delay (default 15)")
    parser.add_argument("--codex-bin", default=os.environ.get("CODEX_BIN", "codex"), help="codex executable (env CODEX_BIN)")
    parser.add_argument("--name", default=socket.gethostname(), help="this host's name in the ledger (default: hostname)")
    parser.add_argument("--http", metavar="HOST:PORT",
                        help="serve /healthz, /metrics and a status page there (off by default; keep it on loopback)")
    parser.add_argument("--namespace", default=os.environ.get("RUNNER_FLEET_NAMESPACE", DEFAULT_NAMESPACE),
                        help="prefix of every Redis key (env RUNNER_FLEET_NAMESPACE)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    configure_logging()
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)  # Dramatiq's own logger
    options = WorkerOptions(
        broker=args.broker, jobs_dir=args.jobs_dir, slots=args.slots, queues=args.queues or [DEFAULT_QUEUE],
        namespace=args.namespace, name=args.name, codex_bin=args.codex_bin,
        heartbeat_timeout=args.heartbeat_timeout, grace=args.grace, min_free_gb=args.min_free_gb,
        check_interval=args.check_interval, max_infra_retries=args.max_infra_retries, retry_backoff=args.retry_backoff,
        http=args.http,
    )
    try:
        return FleetWorker(options).serve()
    except REFUSALS as e:
        log.error("worker_refused", reason=e.reason, exit_code=int(exit_code_of(e)))
        print(f"runner worker: {e}", file=sys.stderr)
        return int(exit_code_of(e))
