"""Batches: many tags (or attempts), each its own job root and its own task process.

The batch is a thin user of the supervisor (``runner.tasks.supervisor``): it turns tags into
``TaskSpec``s (the operator's settings, each for its own tag), runs them ``workers`` at a
time, and keeps the ledger (rows from ``reducers.outcome``, the one rule) and the summary.

Invariants:
- isolation by process: one task's failure, timeout, crash or interrupt cannot
  stop or corrupt another; each child holds its own job root's lock;
- the ledger is upserted (atomically) after each task, under one lock;
- a rerun skips tags the ledger records as evaluated and resumes the rest
  (each child resumes from its markers);
- an interrupt of the batch is passed to every running child, which cleans up
  as a single run does; no new task starts after it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from reducers.outcome import TaskState, task_facts
from runner.agents import AgentName, agent_for
from runner.audit import read_audit_labels
from runner.budget import SuiteBudget, check_budget, spent_costs
from runner.disk_policy import DiskPolicy
from runner.docker_utils import connect
from runner.errors import BadInputError, DockerUnavailableError, ExitCode, REFUSALS
from runner.images import pin_names
from runner.jobroot import JobRoot
from runner.journal import default_state_dir, evaluated
from runner.ledger import LedgerRow, RunLedger, row_key
from runner.pricing import load_rate_card
from runner.public import private_texts_for
from runner.lock import job_root_lock
from runner.tags import check_attempts
from runner.tasks.protocol import TaskRequest
from runner.tasks.spec import HostSettings, TaskSpec, ensure_dir, resolve
from runner.tasks.supervisor import TaskEnd, TaskProcesses, TaskStarter, run_task

log = structlog.get_logger(__name__)

BATCH_LOGS = ".batch-logs"
BATCH_LOCK = ".batch.lock"


@dataclass(frozen=True)
class Unit:
    """One task of a batch: a tag, or one attempt of a tag, or one agent's run of it, with its own job root."""

    tag: str
    attempt: int | None
    job_root: Path
    arm: str | None = None  # the agent, in a batch that compares agents (--agents)
    tag_root: Path | None = None  # where the tag's prompt is, when the unit's job root is below it

    @property
    def name(self) -> str:
        return row_key(self.tag, self.attempt, self.arm)

    @property
    def log_name(self) -> str:
        return self.name.replace("/", ".") + ".log"


def batch_units(jobs_dir: Path, tags: list[str], attempts: int, agents: tuple[str, ...] = ()) -> list[Unit]:
    """One job root per tag (``DIR/<tag>``), or per attempt (``DIR/<tag>/attempt-<i>``) when there are several;
    comparing agents (two or more), one per tag and agent (``DIR/<tag>/<agent>``), agent after agent."""
    if len(agents) > 1:
        return [Unit(tag, None, jobs_dir / tag / agent, arm=agent, tag_root=jobs_dir / tag)
                for agent in agents for tag in tags]
    if attempts == 1:
        return [Unit(tag, None, jobs_dir / tag) for tag in tags]
    return attempt_units(tags, attempts, lambda tag: jobs_dir / tag)


def attempt_units(tags: list[str], attempts: int, root_of: Callable[[str], Path]) -> list[Unit]:
    """Attempt-major: every tag's first attempt comes first, so the first wave extracts different
    images at once and the later attempts, which wait for their tag's extraction, come after."""
    return [Unit(tag, i, root_of(tag) / f"attempt-{i}", tag_root=root_of(tag))
            for i in range(1, attempts + 1) for tag in tags]


def seed_prompt(unit: Unit) -> None:
    """An attempt's (or an agent's) job root gets the tag's prompt (``<tag root>/context/prompt.md``)
    unless it has its own."""
    if unit.tag_root is None:
        return
    own = JobRoot.at(unit.job_root, unit.tag).prompt
    shared = JobRoot.at(unit.tag_root, unit.tag).prompt
    if own.exists() or not shared.is_file():
        return  # no prompt at all: the attempt itself refuses, naming the file
    own.parent.mkdir(parents=True, exist_ok=True)
    own.write_bytes(shared.read_bytes())




class Progress(Protocol):
    def started(self, tag: str) -> None: ...
    def phase(self, tag: str, phase: str) -> None: ...
    def finished(self, row: LedgerRow) -> None: ...
    def skipped(self, tag: str) -> None: ...


@dataclass
class BatchSummary:
    tags: int
    skipped_completed: int
    ran: int
    resolved: int
    failures_by_label: dict[str, int]
    states: dict[str, int]
    wall_seconds: float
    phase_seconds: dict[str, float]
    interrupted: bool
    exit_code_resolved: int = 0
    verdict_untrusted: int = 0
    evaluated: int = 0  # tasks whose process completed (exit 0): every one of them, or the batch exits 1
    # From an audit ledger in the jobs directory (``python -m runner audit --jobs-dir``): tag -> label.
    audit_labels: dict[str, str] | None = None
    resolved_tags: tuple[str, ...] = ()
    ran_tags: tuple[str, ...] = ()
    attempts: int = 1
    # With attempts: the ledger's per-tag summaries (n, c, pass@k) and the suite's mean pass@k.
    pass_at: list[dict[str, Any]] | None = None
    suite_pass_at: dict[str, Any] | None = None
    # What the suite (every row of the ledger) cost, and of its budget what is left.
    cost: dict[str, Any] | None = None
    # Comparing agents (--agents): each agent's resolved rate, pass@k, tokens and cost, and per tag who resolved it.
    comparison: dict[str, Any] | None = None

    @classmethod
    def not_started(cls, tags: int) -> BatchSummary:
        """Interrupted before any task started."""
        return cls(tags=tags, skipped_completed=0, ran=0, resolved=0, failures_by_label={}, states={},
                   wall_seconds=0.0, phase_seconds={}, interrupted=True)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return int(ExitCode.INTERRUPTED)
        return int(ExitCode.COMPLETED) if self.evaluated == self.ran else int(ExitCode.RUNNER_FAILURE)

    def report(self) -> dict[str, Any]:
        return {
            "mode": "batch",
            "tags": self.tags,
            "skipped_completed": self.skipped_completed,
            "ran": self.ran,
            "resolved": self.resolved,
            "resolved_rate": round(self.resolved / self.ran, 4) if self.ran else 0.0,
            "states": self.states,
            "failures_by_label": self.failures_by_label,
            "wall_seconds": round(self.wall_seconds, 3),
            "phase_seconds": {k: round(v, 3) for k, v in sorted(self.phase_seconds.items())},
            "interrupted": self.interrupted,
            "exit_code": self.exit_code,
            "exit_code_resolved": self.exit_code_resolved,
            "verdict_untrusted": self.verdict_untrusted,
            **({"audit": self._over_valid()} if self.audit_labels is not None else {}),
            **({"attempts": self.attempts, "tasks": self.pass_at, "suite": self.suite_pass_at}
               if self.attempts > 1 else {}),
            **({"cost": self.cost} if self.cost is not None else {}),
            **({"comparison": self.comparison} if self.comparison is not None else {}),
        }

    def _over_valid(self) -> dict[str, Any]:
        """The resolved rate over the tags the gold-patch audit found ``valid``."""
        labels = self.audit_labels or {}
        valid = [tag for tag in self.ran_tags if labels.get(tag) == "valid"]
        resolved = [tag for tag in valid if tag in self.resolved_tags]
        return {
            "valid_tags_ran": len(valid),
            "resolved_valid": len(resolved),
            "resolved_rate_valid": round(len(resolved) / len(valid), 4) if valid else 0.0,
            "labels_of_ran_tags": dict(Counter(labels.get(tag, "not_audited") for tag in self.ran_tags)),
        }


def _row(unit: Unit, end: TaskEnd, wall: float, *, stopping: bool = False) -> LedgerRow:
    """The ledger row of a task: its facts by the one rule (``reducers.outcome``), keyed by the unit."""
    run = end.outcome.run if end.outcome is not None else None
    facts = task_facts(run, end.returncode, round(wall, 3), stopping=stopping)
    return LedgerRow(tag=unit.tag, attempt=unit.attempt, arm=unit.arm, **facts.model_dump())


def _run_one(
    template: TaskSpec,
    host: HostSettings,
    unit: Unit,
    logs_dir: Path,
    children: TaskProcesses,
    on_phase: Callable[[str], None],
    pin: str | None,
    starter: TaskStarter,
) -> tuple[TaskEnd, float]:
    started = time.monotonic()
    seed_prompt(unit)
    spec = template.for_tag(unit.tag).pinned(pin)
    if unit.arm is not None:
        spec = spec.model_copy(update={"agent": AgentName(unit.arm)})
    request = TaskRequest(spec=spec, job_root=unit.job_root, attempt=unit.attempt, host=host)
    end = run_task(request, logs_dir / unit.log_name, children, on_phase, starter)
    return end, time.monotonic() - started


def run_batch(
    template: TaskSpec,
    host: HostSettings,
    tags: list[str],
    jobs_dir: Path,
    workers: int,
    progress: Progress,
    *,
    attempts: int = 1,
    suite_budget_usd: float | None = None,
    agents: tuple[str, ...] = (),
    disk: DiskPolicy = DiskPolicy(),
) -> BatchSummary:
    """Run every tag (or attempt) not yet evaluated, ``workers`` at a time; the ledger after each.

    ``template``: the operator's settings; each tag gets them as its own spec (``for_tag``), on
    the image its name meant when the batch started (``runner.images.pin_names``).
    ``agents``: two or more compare them: each tag runs once per agent, all in one ledger.
    ``suite_budget_usd``: no task starts once the suite's spending would pass it (``runner.budget``).
    ``disk``: what a finished task may leave behind (its tree, the images pulled for it).

    Raises:
        BadInputError: bad ``workers``, ``attempts`` or jobs directory, or another batch holds it.
    """
    check_attempts(attempts)
    if len(agents) > 1 and attempts > 1:
        raise BadInputError("--agents compares agents one attempt each; give --attempts 1")
    for agent in agents:
        agent_for(agent)  # an unknown name is refused before anything starts
    jobs_dir = ensure_dir(jobs_dir, "--jobs-dir")
    return run_units(template, host, batch_units(jobs_dir, tags, attempts, agents), jobs_dir, workers, progress,
                     suite_budget_usd=suite_budget_usd, disk=disk)


def run_attempts(
    spec: TaskSpec, host: HostSettings, job_root: Path, attempts: int, workers: int, progress: Progress,
    *, suite_budget_usd: float | None = None, disk: DiskPolicy = DiskPolicy(),
) -> BatchSummary:
    """``--execute --job-root J --attempts K``: K attempts of the one tag, at ``J/attempt-<i>``, ledger at ``J``.

    Raises:
        BadInputError: bad ``workers``, ``attempts`` or job root, or another run holds it.
    """
    job_root = ensure_dir(job_root, "--job-root")
    units = attempt_units([spec.tag], check_attempts(attempts), lambda _tag: job_root)
    return run_units(spec, host, units, job_root, workers, progress, suite_budget_usd=suite_budget_usd, disk=disk)


def run_units(
    template: TaskSpec,
    host: HostSettings,
    units: list[Unit],
    ledger_dir: Path,
    workers: int,
    progress: Progress,
    *,
    suite_budget_usd: float | None = None,
    disk: DiskPolicy = DiskPolicy(),
) -> BatchSummary:
    """Each unit in its own process, ``workers`` at a time; one ledger (and one lock) in ``ledger_dir``."""
    if workers < 1 or workers > 64:
        raise BadInputError("--workers must be between 1 and 64")
    check_budget(suite_budget_usd)
    load_rate_card(host.rate_card)  # a bad card is refused before any task, not by each
    with job_root_lock(ledger_dir, name=BATCH_LOCK, what="batch"):
        return _run_locked(template, host, units, ledger_dir, workers, progress, suite_budget_usd, disk)


def _image_names(template: TaskSpec, host: HostSettings, units: list[Unit]) -> dict[str, str]:
    """Each tag's image name, as its task resolves it (the name a pin is taken of)."""
    return {tag: resolve(template.for_tag(tag), host).image_name for tag in sorted({unit.tag for unit in units})}


def _pins(names: dict[str, str], host: HostSettings) -> dict[str, str]:
    """Each tag's image (``names``) pinned once, at the batch's start (nothing to run, or no daemon: none)."""
    if not names:
        return {}
    try:
        client = connect()
    except DockerUnavailableError:
        return {}  # each task's precheck says so, in its own files
    try:
        return {tag: pin.ref for tag, pin in pin_names(client, names, allow_pull=host.allow_pull).items()}
    finally:
        client.close()


def _evict(disk: DiskPolicy, state_dir: Path, needed: set[str]) -> None:
    if disk.image_budget_gb is None:
        return
    try:
        client = connect()
    except DockerUnavailableError:
        return
    try:
        disk.evict(client, state_dir, needed)
    finally:
        client.close()


def _run_locked(
    template: TaskSpec, host: HostSettings, units: list[Unit], jobs_dir: Path, workers: int, progress: Progress,
    suite_budget_usd: float | None, disk: DiskPolicy,
) -> BatchSummary:
    ledger = RunLedger(jobs_dir, private_texts_for(jobs_dir))
    ledger.budget_usd = suite_budget_usd
    ledger_lock = threading.Lock()
    children = TaskProcesses()
    state_dir = host.state_dir or default_state_dir()
    todo = [
        unit for unit in units
        if not (ledger.evaluated(unit.tag, unit.attempt, unit.arm) and evaluated(state_dir, JobRoot.at(unit.job_root, unit.tag)))
    ]
    for unit in units:
        if unit not in todo:
            progress.skipped(unit.name)
    budget = _budget(ledger, todo, suite_budget_usd)
    names = _image_names(template, host, todo)
    pins = _pins(names, host)
    unfinished = {unit.name: unit for unit in todo}  # what the images still needed are the images of
    warned_unpriced = threading.Event()
    ran: list[LedgerRow] = []
    started = time.monotonic()

    def task(unit: Unit) -> None:
        with children.task():  # counted before it looks at stopping: a stop waits for it to end
            if children.stopping.is_set():
                return
            if budget is not None and not budget.try_start(unit.name, JobRoot.at(unit.job_root, unit.tag).logs):
                record(unit, LedgerRow(tag=unit.tag, attempt=unit.attempt, arm=unit.arm, state=TaskState.SKIPPED_BUDGET))
                return
            run_unit(unit)

    def record(unit: Unit, row: LedgerRow) -> None:
        with ledger_lock:
            try:
                ledger.upsert(row)
            except (OSError, *REFUSALS) as e:  # the ledger could not be written: the task's own files stand
                log.error("ledger_not_written", task=unit.name, error_type=type(e).__name__)
            ran.append(row)
            unfinished.pop(unit.name, None)
            needed = ({pins.get(u.tag) or names[u.tag] for u in unfinished.values()}
                      if disk.image_budget_gb is not None else set())  # without a budget nothing is evicted
        progress.finished(row)
        disk.after_task(JobRoot.at(unit.job_root, unit.tag), row)
        _evict(disk, state_dir, needed)

    def run_unit(unit: Unit) -> None:
        progress.started(unit.name)
        try:
            end, wall = _run_one(
                template, host, unit, jobs_dir / BATCH_LOGS, children, lambda phase: progress.phase(unit.name, phase),
                pins.get(unit.tag), starter,
            )
        except OSError as e:  # the task could not even start (no space for its log, say)
            log.error("task_not_started", task=unit.name, error_type=type(e).__name__)
            end, wall = TaskEnd(returncode=int(ExitCode.BAD_ENVIRONMENT), outcome=None), 0.0
        row = _row(unit, end, wall, stopping=children.stopping.is_set())
        if budget is not None:
            budget.finished(unit.name, row.cost_usd)
        if row.cost_usd is None and row.model is not None and not warned_unpriced.is_set():
            warned_unpriced.set()  # once per suite: every task of that model is unpriced alike
            log.warning("suite_cost_unknown", task=unit.name, model=row.model,
                        hint="the model is not on the rate card: its cost is unknown and no budget counts it")
        record(unit, row)

    interrupted = False
    starter = TaskStarter().__enter__()  # one fork server for every slot; closed once they are all done
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="task")
    try:
        futures = [pool.submit(task, unit) for unit in todo]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for future in done:
            future.result()  # a coordinator bug surfaces here rather than vanishing
    except KeyboardInterrupt:
        interrupted = True
        pool.shutdown(wait=False, cancel_futures=True)  # no task not yet begun will begin
        children.stop_until_idle()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        starter.close()
        if ledger.journal_entries:
            try:
                ledger.compact()  # the snapshot holds every row when the batch ends
            except (OSError, *REFUSALS) as e:
                log.error("ledger_not_written", error_type=type(e).__name__)
    interrupted = interrupted or any(row.state is TaskState.CANCELLED for row in ran)
    skipped_budget = [row for row in ran if row.state is TaskState.SKIPPED_BUDGET]
    ran = [row for row in ran if row.state is not TaskState.SKIPPED_BUDGET]
    phase_seconds: Counter[str] = Counter()
    for row in ran:
        phase_seconds.update(row.phase_durations_seconds)
    document = ledger.document()
    return BatchSummary(
        tags=len({unit.tag for unit in units}),
        skipped_completed=len(units) - len(todo),
        ran=len(ran),
        resolved=sum(1 for row in ran if row.resolved),
        failures_by_label=dict(Counter(row.failure_label or row.state.value for row in ran if not row.resolved)),
        states=dict(Counter(row.state.value for row in [*ran, *skipped_budget])),
        evaluated=sum(1 for row in ran if row.evaluated),
        wall_seconds=time.monotonic() - started,
        phase_seconds=dict(phase_seconds),
        interrupted=interrupted,
        exit_code_resolved=sum(1 for row in ran if row.exit_code_verdict),
        verdict_untrusted=sum(1 for row in ran if row.verdict_untrusted),
        audit_labels=_audit_labels(jobs_dir),
        resolved_tags=tuple(row.tag for row in ran if row.resolved),
        ran_tags=tuple(row.tag for row in ran),
        attempts=max(unit.attempt or 1 for unit in units) if units else 1,
        pass_at=document.get("tasks"),
        suite_pass_at=document.get("suite"),
        cost=document.get("cost"),
        comparison=document.get("comparison"),
    )


def _budget(ledger: RunLedger, todo: list[Unit], limit_usd: float | None) -> SuiteBudget | None:
    """The suite's budget, already charged with what its rows not run again cost."""
    if limit_usd is None:
        return None
    budget = SuiteBudget(limit_usd)
    again = {unit.name for unit in todo}  # their cost is counted when they end (a resumed codex included)
    budget.seed(spent_costs(row for key, row in ledger.rows.items() if key not in again))
    return budget


def _audit_labels(jobs_dir: Path) -> dict[str, str] | None:
    return read_audit_labels(jobs_dir)
