"""``python -m runner worker``: the daemon of one trusted host, a Dramatiq worker on the fleet's Redis.

Invariants:
- the unit of work is the same isolated task process as the batch's, started by
  the supervisor (``runner.tasks.supervisor.run_task``) with the message's own
  ``TaskSpec``: a child in its own session, its own job root
  ``<jobs>/<suite>/<tag>[/<arm>]/attempt-<i>`` (the arm: an agent other than codex), its markers, its labelled containers; the
  child gets SIGTERM if this worker dies (no run outlives it);
- what becomes of a finished task (its row, done, requeue or retry) is
  ``runner.fleet.outcome``'s, by the rule every ledger shares;
- at most ``--slots`` tasks at once (Dramatiq threads and prefetch = slots), and
  none taken while a host check fails or the worker drains;
- a task runs only under its lease; its ledger row is written by the lease holder,
  and a final row is kept on this host (``runner.fleet.outbox``) until the ledger has it;
- the first SIGTERM drains (running tasks finish, none is taken); a second one, or
  ``--grace`` seconds, interrupts them through the child's cleanup and puts their
  messages back on the queue, where a restarted worker resumes them from markers;
- nothing a message holds can crash the worker: a bad one becomes a failed row, and
  its text (the prompt) is never logged;
- a task whose agent fails this host's checks of it (``runner.fleet.hostchecks.AgentChecks``:
  installed, version, login) is not started: an infrastructure failure, ``agent_unavailable``,
  retried by the fleet's rule (another host may have it) and never counted as the agent's;
- a task of a suite with a budget starts only when the suite's budget admits it
  (``runner.fleet.budget``, the batch's rule across hosts); one that does not fit ends
  ``skipped_budget``, and while it runs its live cost is published every tick.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from types import FrameType
from typing import Any

import dramatiq
import redis
import structlog
from dramatiq.errors import Retry
from dramatiq.middleware import CurrentMessage
from structlog.contextvars import bound_contextvars

from runner.atomic import write_bytes_atomic
from runner.budget import live_cost
from runner.docker_utils import connect, sweep_strays
from runner.entry import answer
from runner.errors import BadInputError, DockerUnavailableError, EnvironmentNotReadyError, ExitCode
from runner.fleet.budget import FleetBudget
from runner.fleet.broker import ACTOR_NAME, TIME_LIMIT_MS, Keys, connect_redis, make_broker, quiet_dramatiq_messages
from runner.agents import DEFAULT_AGENT
from runner.fleet.hostchecks import AgentChecks, check_host
from runner.fleet.leases import Lease
from runner.fleet.ledger import FINAL_STATES, LedgerRow, SuiteLedger, TaskState, now
from runner.fleet.options import WorkerOptions, build_parser, options_from
from runner.fleet.outbox import Outbox
from runner.fleet.prefetch import Prefetcher
from runner.fleet.outcome import Action, Decision, Recorder, StopReason, decide, decide_evaluation, not_started
from runner.fleet.rejects import rejected_row
from runner.fleet.state import RunningTask, WorkerState
from runner.fleet.views import WorkerStatusSource
from runner.jobroot import PROMPT, JobRoot
from runner.journal import default_state_dir
from runner.ledger import row_key
from runner.logs import configure_logging
from runner.tasks.protocol import EvalMessage, MessageError, TaskMessage, parse_any_message
from runner.tasks.spec import resolve
from runner.tasks.supervisor import TaskStarter, run_task
from runner.views.server import BackgroundServer, http_address

log = structlog.get_logger(__name__)

WORKER_LOGS = ".worker-logs"
SHUTDOWN_TIMEOUT_MS = 30_000  # Dramatiq's threads are idle by then: the drain waited for the tasks


class FleetWorker:
    """One host's worker: Dramatiq consumers gated by the host's health, each message a task process.

    The actor (``_handle``) is a thin call into the supervisor; the loops beside it send
    heartbeats, renew leases, hear cancels, re-check the host and deliver kept rows.
    """

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.keys = Keys(options.namespace)
        self.redis = connect_redis(options.broker)
        self.state = WorkerState(options.name, options.slots, options.queues)
        self.recorder = Recorder(self.redis, self.keys, Outbox(options.jobs_dir), options.name)
        self.lease_ttl = options.heartbeat_timeout
        self.budget = FleetBudget(self.redis, self.keys, ttl=max(options.heartbeat_timeout, 2.0))
        self.disk = options.disk()
        self.agents = AgentChecks(options.host)
        state_dir = options.host.state_dir or default_state_dir()
        self.prefetcher = (Prefetcher(self.redis, self.keys, options.queues, options.host, options.prefetch, state_dir,
                                      room=self._room_to_prefetch if self.disk.image_budget_gb is not None else None)
                           if options.prefetch and options.host.allow_pull else None)
        self.starter = TaskStarter()  # every slot's tasks forked by one preloaded server, started in serve()
        self._budgeted: set[tuple[str, str]] = set()  # (suite, key) of the admitted tasks running here
        self._budget_lock = threading.Lock()
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
        """The actor: one message, one isolated run; never raises but to retry an infra failure."""
        current = CurrentMessage.get_current_message()
        retries = int(current.options.get("retries", 0)) if current is not None else 0
        queue = (current.queue_name if current is not None else self.options.queues[0]).removesuffix(".DQ")
        try:
            task = parse_any_message(payload)
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

    def _take(self, task: TaskMessage | EvalMessage, queue: str, retries: int) -> Action:
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
            self._release_budget(task)
            try:
                lease.release()
            except redis.RedisError:
                pass  # it expires on its own

    def _job_root(self, task: TaskMessage) -> Path:
        """``<jobs>/<suite>/<tag>[/<arm>]/attempt-<i>``: the batch's layout (``row_key``), an agent's arm apart."""
        return self.options.jobs_dir / task.suite / row_key(task.tag, task.attempt, task.arm)

    def _admit(self, task: TaskMessage) -> bool:
        """The suite's budget admits the task (always, without one); from now its live cost is published."""
        if not self.budget.try_start(task.suite, task.key):
            return False
        with self._budget_lock:
            self._budgeted.add((task.suite, task.key))
        return True

    def _release_budget(self, task: TaskMessage | EvalMessage) -> None:
        with self._budget_lock:
            if (task.suite, task.key) not in self._budgeted:
                return
            self._budgeted.discard((task.suite, task.key))
        try:
            self.budget.release(task.suite, task.key)
        except redis.RedisError:
            pass  # its published cost expires on its own

    def _publish_spending(self) -> None:
        """Each admitted running task's cost so far (its codex meter's file), for every host's admissions."""
        with self._budget_lock:
            budgeted = set(self._budgeted)
        for running in self.state.running():
            task = running.task
            if isinstance(task, TaskMessage) and (task.suite, task.key) in budgeted:
                self.budget.publish(task.suite, task.key, live_cost(JobRoot.at(self._job_root(task), task.tag).logs))

    def _skip_budget(self, task: TaskMessage, queue: str, retries: int) -> tuple[LedgerRow | None, Action]:
        """Not started: the suite's money would not cover it. Final for this submission, neither failed nor
        retried; a later ``submit`` with a larger budget queues it again."""
        skipped = LedgerRow(tag=task.tag, attempt=task.attempt, state=TaskState.SKIPPED_BUDGET, queue=queue,
                            retries=retries, submitted_at=now(), finished_at=now())

        def change(row: LedgerRow | None) -> LedgerRow | None:
            if row is not None and row.state is not TaskState.QUEUED:
                return None
            return skipped if row is None else skipped.model_copy(update={"submitted_at": row.submitted_at})

        return SuiteLedger(self.redis, self.keys, task.suite).update(task.key, change), Action.DONE

    def _run(
        self, task: TaskMessage | EvalMessage, running: RunningTask, ledger: SuiteLedger, queue: str, retries: int
    ) -> tuple[LedgerRow | None, Action]:
        if isinstance(task, EvalMessage):
            return self._evaluate(task, running, queue, retries)
        agent = task.spec.agent or DEFAULT_AGENT
        failing = [check for check in self.agents.checks(agent) if not check.ok]
        self.state.agent_checks = self.agents.reported()
        if failing:  # before the budget: nothing spent, nothing admitted
            log.warning("agent_unavailable", agent=agent.value, failing=[c.name for c in failing],
                        details=[c.detail for c in failing])
            return self._record(task, queue, not_started("agent_unavailable", retries, self.options.max_infra_retries,
                                                         agent=agent.value))
        if not self._admit(task):
            return self._skip_budget(task, queue, retries)
        job_root = self._job_root(task)
        started = time.monotonic()
        try:
            write_bytes_atomic(job_root / PROMPT, task.prompt.encode(), mode=0o600)
        except OSError:
            return self._record(task, queue, not_started("job_root_unwritable", retries, self.options.max_infra_retries))
        self.recorder.running(task, queue, retries)
        log.info("task_started", host=self.options.name, retries=retries)

        def on_phase(phase: str) -> None:
            self.state.set_phase(running, phase)
            try:
                ledger.set_fields(task.key, phase=phase)
            except redis.RedisError:
                log.warning("ledger_not_written", reason="broker unreachable")

        arm = f".{task.arm}" if task.arm is not None else ""
        log_path = self.options.jobs_dir / task.suite / WORKER_LOGS / f"{task.tag}{arm}.attempt-{task.attempt}.log"
        try:
            end = run_task(task.request(job_root, self.options.host), log_path, running, on_phase, self.starter)
        except OSError:  # the task could not even start (no space for its log, say)
            return self._record(task, queue, not_started("task_not_started", retries, self.options.max_infra_retries))
        wall = round(time.monotonic() - started, 3)
        reason = running.stop_reason
        log.info("task_exited", exit_code=end.returncode, stop_reason=reason.value if reason else None,
                 wall_seconds=wall)
        decision = decide(end.outcome.run if end.outcome is not None else None, end.returncode, wall,
                          stop_reason=reason, retries=retries, max_retries=self.options.max_infra_retries)
        recorded = self._record(task, queue, decision)
        self._free_disk(task, job_root, decision)
        return recorded

    def _free_disk(self, task: TaskMessage, job_root: Path, decision: Decision) -> None:
        """The host's disk policy after a task: its tree (when scored) and pulled images over the budget,
        keeping every image a task running here still needs."""
        disk = self.disk
        if decision.final:
            disk.after_task(JobRoot.at(job_root, task.tag), decision.facts)
        if disk.image_budget_gb is None:
            return
        needed = self._running_images(but=task.key)
        if self.prefetcher is not None:
            needed |= self.prefetcher.wanted()  # pulled for the next messages: kept for them
        try:
            client = connect()
        except DockerUnavailableError:
            return
        try:
            disk.evict(client, self.options.host.state_dir or default_state_dir(), needed)
        finally:
            client.close()

    def _running_images(self, *, but: str | None = None) -> set[str]:
        """The images of the tasks running here (but the one named): never evicted."""
        return {resolve(other.task.spec, self.options.host).resolved_image for other in self.state.running()
                if isinstance(other.task, TaskMessage) and other.task.key != but}

    def _room_to_prefetch(self, client: Any, wanted: set[str]) -> bool:
        """The prefetcher's ``room``: evict under the budget keeping the running and the wanted images."""
        state_dir = self.options.host.state_dir or default_state_dir()
        return self.disk.room_to_prefetch(client, state_dir, self._running_images() | wanted)

    def _evaluate(self, task: EvalMessage, running: RunningTask, queue: str, retries: int) -> tuple[LedgerRow | None, Action]:
        """An evaluation unit: its patch written under its own job root, scored by a task process of the
        supervisor's (``runner task`` in evaluation mode: ``evaluate``'s scoring), its row by the same rule."""
        job_root = self.options.jobs_dir / task.suite / "eval" / task.tag / task.unit.name
        started = time.monotonic()
        try:
            data = task.patch_bytes()  # checked again: the bytes scored are the bytes submitted
            job_root.mkdir(parents=True, exist_ok=True)
            if task.unit.rejection is None:
                write_bytes_atomic(job_root / task.unit.name, data, mode=0o600)
        except OSError:
            return self._record(task, queue, not_started("job_root_unwritable", retries, self.options.max_infra_retries))
        self.recorder.running(task, queue, retries)
        log.info("task_started", host=self.options.name, retries=retries, kind="eval")
        log_path = self.options.jobs_dir / task.suite / WORKER_LOGS / f"{task.tag}.eval-{task.unit.name}.log"
        try:
            end = run_task(task.request(job_root, self.options.host), log_path, running, starter=self.starter)
        except OSError:
            return self._record(task, queue, not_started("task_not_started", retries, self.options.max_infra_retries))
        wall = round(time.monotonic() - started, 3)
        reason = running.stop_reason
        evaluation = end.outcome.evaluation if end.outcome is not None else None
        log.info("task_exited", exit_code=end.returncode, stop_reason=reason.value if reason else None,
                 wall_seconds=wall, kind="eval")
        if evaluation is not None and reason is not None and end.returncode != 0:
            evaluation = None  # stopped by this worker before its verdict: the task rule (requeue, cancel) decides
        decision = decide_evaluation(evaluation, end.returncode, wall, stop_reason=reason, retries=retries,
                                     max_retries=self.options.max_infra_retries)
        return self._record(task, queue, decision, evaluation if decision.final else None)

    def _record(self, task: TaskMessage | EvalMessage, queue: str, decision: Decision,
                evaluation: dict | None = None) -> tuple[LedgerRow | None, Action]:
        facts = decision.facts
        if decision.action is Action.RETRY:
            log.warning("task_infra_failure", failure_label=facts.failure_label, retry=decision.retries,
                        max_retries=self.options.max_infra_retries)
        elif decision.action is Action.REQUEUE:
            log.info("task_given_back", reason="stopped by this worker")
        elif facts.infra_failure:
            log.error("task_infra_failure", failure_label=facts.failure_label, retries_exhausted=True)
        if facts.infra_failure or decision.action is not Action.DONE:
            self._recheck.set()  # the host may be what broke: look before taking anything else
        row = self.recorder.record(task, queue, decision, evaluation)
        if decision.final:
            log.info("task_finished", state=facts.state.value, resolved=facts.resolved, failure_label=facts.failure_label)
        return row, decision.action

    def _reject(self, payload: Any, error: MessageError, queue: str, message_id: str) -> None:
        """A message that cannot become a task: a failed row where the operator will look for it."""
        suite, row = rejected_row(payload, error, queue=queue, host=self.options.name, message_id=message_id)
        log.error("message_rejected", suite=suite, task=row.key, error=str(error)[:500])
        try:
            SuiteLedger(self.redis, self.keys, suite).update(
                row.key, lambda current: None if current is not None and current.state is TaskState.RUNNING else row
            )
        except redis.RedisError:
            log.error("ledger_not_written", reason="broker unreachable")

    # -- the daemon --------------------------------------------------------------------------

    def _check_host(self) -> None:
        report = check_host(self.options.jobs_dir, self.options.host, self.options.min_free_gb)
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
        """Heartbeats, lease renewals, cancel requests and the kept rows, every tick."""
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
                self._publish_spending()
                self.recorder.redeliver_kept()
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

    def serve(self) -> tuple[dict[str, Any], int]:
        """Run until drained; returns the worker's report and exit code."""
        signals = {"count": 0}

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            signals["count"] += 1

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.starter.__enter__()  # its imports run beside the sweep and the host checks
        self._sweep()
        self._check_host()
        views = self._start_views()
        worker = dramatiq.Worker(self.broker, queues=set(self.options.queues), worker_threads=self.options.slots,
                                 worker_timeout=100)
        # Prefetch counts running messages: with one per slot, a busy host holds no message
        # another host could run now.
        worker.queue_prefetch = self.options.slots
        threads = [threading.Thread(target=target, name=name, daemon=True)
                   for target, name in ((self._host_loop, "host-checks"), (self._monitor_loop, "monitor"))]
        if self.prefetcher is not None:
            threads.append(threading.Thread(target=self.prefetcher.run, args=(self._stop,), name="prefetch",
                                            daemon=True))
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
                self.recorder.redeliver_kept()
            except redis.RedisError:
                pass
            self.broker.close()
            self.starter.close()  # after worker.stop: no task of this worker runs any more
            if views is not None:
                views.__exit__(None, None, None)
        log.info("worker_stopped", finished=self.state.finished)
        report = {"mode": "worker", "name": self.options.name, "finished": self.state.finished, "interrupted": interrupted}
        return report, int(ExitCode.COMPLETED)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    configure_logging()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)  # Dramatiq's own logger
    quiet_dramatiq_messages()
    return answer("runner worker", lambda: FleetWorker(options_from(args)).serve())
