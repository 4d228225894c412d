"""What a worker knows about itself while it runs: its slots, its host checks, each task's phase.

For the views (``worker --http``: health, metrics, the status page) and the tests to read;
thread-safe, and nothing in it can stop a task (a listener that fails is logged).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from runner.fleet.hostchecks import HostReport
from runner.phases.precheck import Check
from runner.fleet.leases import Lease
from runner.fleet.ledger import LedgerRow, now
from runner.fleet.outcome import StopReason
from runner.tasks.protocol import TaskMessage

log = structlog.get_logger(__name__)


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
            "suite": self.task.suite, "tag": self.task.tag, "attempt": self.task.attempt, "key": self.task.key,
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
        self.agent_checks: list[Check] = []  # of each agent a task named, beside codex's (runner.fleet.hostchecks)
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

    def checks(self) -> list[Check]:
        """The host's checks, then those of each agent a task named (which gate only that agent's tasks)."""
        return [*(self.host.checks if self.host is not None else []), *self.agent_checks]

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
            "checks": [check.model_dump() for check in self.checks()],
            "started_at": self.started_at,
            "finished": dict(self.finished),
            "tasks": running,
        }
