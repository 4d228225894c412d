"""Batches: many tags, each its own job root and its own ``python -m runner --execute`` process.

Invariants:
- isolation by process: one task's failure, timeout, crash or interrupt cannot
  stop or corrupt another; each child holds its own job root's lock;
- the ledger is upserted (atomically) after each task, under one lock;
- a rerun skips tags the ledger records as completed and resumes the rest
  (each child resumes from its markers);
- an interrupt of the batch is passed to every running child, which cleans up
  as a single run does; no new task starts after it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from runner.audit import read_audit_labels
from runner.errors import BadInputError, ExitCode, REFUSALS
from runner.jobroot import BENCHMARK_RUN, JobRoot
from runner.journal import default_state_dir, evaluated
from runner.ledger import LedgerRow, RunLedger, row_key
from runner.lifeline import BATCH_PARENT_ENV
from runner.public import private_texts_for
from runner.lock import LOCK_NAME, job_root_lock
from runner.settings import SAFE_HOST_PATH, RunnerSettings
from runner.tags import check_attempts

log = structlog.get_logger(__name__)

BATCH_LOGS = ".batch-logs"
BATCH_LOCK = ".batch.lock"
# A task of an earlier batch that died may still be cleaning up (it got SIGTERM with its batch):
# its job root's lock is waited for this long before the task is started anyway (and refused).
STALE_LOCK_WAIT = 60.0
FOLLOW_INTERVAL = 0.1
_STATE_BY_EXIT = {
    int(ExitCode.COMPLETED): "completed",
    int(ExitCode.RUNNER_FAILURE): "failed",
    int(ExitCode.BAD_INPUT): "bad_input",
    int(ExitCode.BAD_ENVIRONMENT): "bad_environment",
    int(ExitCode.INTERRUPTED): "interrupted",
}


# The reference's variables that name one task: a batch passes each task's own as flags.
TASK_ENV = frozenset({"TAG", "IMAGE", "JOB_ROOT", "PRECHECK_ONLY"})


@dataclass(frozen=True)
class Unit:
    """One task of a batch: a tag, or one attempt of a tag, with its own job root."""

    tag: str
    attempt: int | None
    job_root: Path

    @property
    def name(self) -> str:
        return row_key(self.tag, self.attempt)

    @property
    def log_name(self) -> str:
        return f"{self.tag}.log" if self.attempt is None else f"{self.tag}.attempt-{self.attempt}.log"


def batch_units(jobs_dir: Path, tags: list[str], attempts: int) -> list[Unit]:
    """One job root per tag (``DIR/<tag>``), or per attempt (``DIR/<tag>/attempt-<i>``) when there are several."""
    if attempts == 1:
        return [Unit(tag, None, jobs_dir / tag) for tag in tags]
    return attempt_units(tags, attempts, lambda tag: jobs_dir / tag)


def attempt_units(tags: list[str], attempts: int, root_of: Callable[[str], Path]) -> list[Unit]:
    """Attempt-major: every tag's first attempt comes first, so the first wave extracts different
    images at once and the later attempts, which wait for their tag's extraction, come after."""
    return [Unit(tag, i, root_of(tag) / f"attempt-{i}") for i in range(1, attempts + 1) for tag in tags]


def seed_prompt(unit: Unit) -> None:
    """An attempt's job root gets the tag's prompt (``<tag root>/context/prompt.md``) unless it has its own."""
    if unit.attempt is None:
        return
    own = JobRoot.at(unit.job_root, unit.tag).prompt
    shared = JobRoot.at(unit.job_root.parent, unit.tag).prompt
    if own.exists() or not shared.is_file():
        return  # no prompt at all: the attempt itself refuses, naming the file
    own.parent.mkdir(parents=True, exist_ok=True)
    own.write_bytes(shared.read_bytes())


def child_environment(environ: dict[str, str] | os._Environ) -> dict[str, str]:
    return {key: value for key, value in environ.items() if key not in TASK_ENV}


def child_argv(settings: RunnerSettings, tag: str, job_root: Path, image: str | None) -> list[str]:
    """The single-task command for one tag: every setting passed as a flag, so it wins over the env.

    ``image``: only an image given as a flag applies to every tag; otherwise each tag gets its own.
    """
    argv = [
        sys.executable, "-m", "runner", "--execute",
        f"--job-root={job_root}",
        f"--tag={tag}",
        f"--codex-bin={settings.codex_bin}",
        f"--codex-timeout={settings.codex_timeout}",
    ]
    # A setting a tag profile may supply goes as a flag only when the operator gave it: otherwise
    # each task gets its own tag's profile (or the defaults), not the batch's default tag's.
    for name, value in (
        ("eval-timeout", settings.eval_timeout),
        ("eval-network", settings.eval_network.value),
        ("source-dir", settings.source_dir),
        ("apply-cmd", settings.apply_cmd),
        ("test-cmd", settings.test_cmd),
    ):
        if settings.operator_gave(name.replace("-", "_")):
            argv.append(f"--{name}={value}")
    if image:
        argv.append(f"--image={image}")
    if settings.model:
        argv.append(f"--model={settings.model}")
    if settings.codex_profile:
        argv.append(f"--codex-profile={settings.codex_profile}")
    if settings.codex_home:
        argv.append(f"--codex-home={settings.codex_home}")
    argv += [f"--codex-config={item}" for item in settings.codex_config]
    argv += [f"--patch-exclude={item}" for item in settings.patch_exclude]
    if settings.allow_pull:
        argv.append("--allow-pull")
    if settings.state_dir is not None:
        argv.append(f"--state-dir={settings.state_dir}")
    if settings.agent_user is not None:
        argv.append(f"--agent-user={settings.agent_user}")
    if settings.allow_unscorable:
        argv.append("--allow-unscorable")
    if settings.cache_dir is not None:
        argv.append(f"--cache-dir={settings.cache_dir}")
    if settings.operator_gave("cache_max_gb"):
        argv.append(f"--cache-max-gb={settings.cache_max_gb}")
    return argv


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
    # From an audit ledger in the jobs directory (``python -m runner audit --jobs-dir``): tag -> label.
    audit_labels: dict[str, str] | None = None
    resolved_tags: tuple[str, ...] = ()
    ran_tags: tuple[str, ...] = ()
    attempts: int = 1
    # With attempts: the ledger's per-tag summaries (n, c, pass@k) and the suite's mean pass@k.
    pass_at: list[dict[str, Any]] | None = None
    suite_pass_at: dict[str, Any] | None = None

    @classmethod
    def not_started(cls, tags: int) -> BatchSummary:
        """Interrupted before any task started."""
        return cls(tags=tags, skipped_completed=0, ran=0, resolved=0, failures_by_label={}, states={},
                   wall_seconds=0.0, phase_seconds={}, interrupted=True)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return int(ExitCode.INTERRUPTED)
        return int(ExitCode.COMPLETED) if self.states.get("completed", 0) == self.ran else int(ExitCode.RUNNER_FAILURE)

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


def _state(exit_code: int, stopping: bool) -> str:
    """A task killed by the batch's own stop (before its handlers were in place) was interrupted."""
    if stopping and exit_code in (-signal.SIGTERM, -signal.SIGINT, -signal.SIGKILL):
        return "interrupted"
    return _STATE_BY_EXIT.get(exit_code, "failed")


def _row(unit: Unit, exit_code: int, wall: float, *, stopping: bool = False) -> LedgerRow:
    run: dict[str, Any] = {}
    try:
        run = json.loads((unit.job_root / BENCHMARK_RUN).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        pass  # refused before any output (bad input): the row says so by its state
    resolved = run.get("official_task_score", {}).get("resolved") if run else None
    return LedgerRow(
        tag=unit.tag,
        attempt=unit.attempt,
        state=_state(exit_code, stopping),
        exit_code=exit_code,
        resolved=resolved if exit_code == 0 else (False if run else None),
        first_failed_phase=run.get("first_failed_phase"),
        failure_label=(run.get("failure_attribution_labels") or [None])[0],
        wall_seconds=round(wall, 3),
        phase_durations_seconds=run.get("phase_durations_seconds", {}),
        patch_sha256=run.get("patch_sha256") if run.get("patch_bytes") else None,
        patch_bytes=run.get("patch_bytes") if run else None,
        image_digest=run.get("image_digest"),
        image_id=run.get("image_id"),
        input_tokens=run.get("metrics", {}).get("input_tokens", 0),
        output_tokens=run.get("metrics", {}).get("output_tokens", 0),
        exit_code_verdict=run.get("evaluation", {}).get("exit_code_verdict") if run.get("evaluation", {}).get("ran") else None,
        verdict_untrusted=bool(run.get("verdict_untrusted", False)),
    )


class _Children:
    """The running child processes, so an interrupt can reach every one of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self.stopping = threading.Event()

    def add(self, child: subprocess.Popen) -> None:
        with self._lock:
            self._running.add(child)
            if self.stopping.is_set():
                child.send_signal(signal.SIGTERM)

    def discard(self, child: subprocess.Popen) -> None:
        with self._lock:
            self._running.discard(child)

    def stop_all(self) -> None:
        with self._lock:
            self.stopping.set()
            for child in self._running:
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)


def _wait_for_stale_lock(job_root: Path, timeout: float = STALE_LOCK_WAIT) -> None:
    """Wait (bounded) while another process holds the job root's lock: after a batch died with -9,
    its tasks are still ending (they got SIGTERM with it) when the rerun starts them again."""
    path = job_root / LOCK_NAME
    if not path.exists():
        return
    deadline = time.monotonic() + timeout
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return  # free (released when fd closes)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN) or time.monotonic() > deadline:
                    return  # the task itself will refuse, naming the holder
            time.sleep(0.2)
    finally:
        os.close(fd)


def _follow(path: Path, child: subprocess.Popen, on_phase: Callable[[str], None]) -> int:
    """Read the task's log as it grows, for its phase events, until the task ends."""
    with path.open("rb") as log_file:
        pending = b""
        while True:
            ended = child.poll() is not None
            chunk = log_file.read()
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if b'"phase_started"' in line:
                    try:
                        phase = json.loads(line).get("phase")
                    except (json.JSONDecodeError, UnicodeDecodeError):
                        continue
                    if isinstance(phase, str):
                        on_phase(phase)
            if ended and not chunk:
                return child.wait()
            if not chunk:
                time.sleep(FOLLOW_INTERVAL)


class ChildRegistry(Protocol):
    """Where a task's child process is registered while it runs, so it can be interrupted."""

    def add(self, child: subprocess.Popen) -> None: ...
    def discard(self, child: subprocess.Popen) -> None: ...


def run_task_process(
    argv: list[str],
    job_root: Path,
    log_path: Path,
    children: ChildRegistry,
    on_phase: Callable[[str], None],
) -> int:
    """One single-task run as a child in its own session; its exit code.

    The batch and the fleet worker both run tasks this way. The child's stderr is the
    log file itself, not a pipe through the parent: each line lands as it is written,
    and the parent dying (even by -9) cannot break it; the child ends with its parent
    (``runner/lifeline.py``). ``on_phase`` gets each phase the child starts.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    _wait_for_stale_lock(job_root)
    with log_path.open("wb") as sink:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sink,
            # Named, the parent's pid lets the task end with it (runner/lifeline.py).
            env={**child_environment(os.environ), BATCH_PARENT_ENV: str(os.getpid())},
            start_new_session=True,  # a terminal's Ctrl-C reaches the parent only; it passes one SIGTERM on
        )
    children.add(child)
    try:
        return _follow(log_path, child, on_phase)
    finally:
        children.discard(child)
        if child.poll() is None:
            child.kill()
            child.wait()


def _run_one(
    settings: RunnerSettings,
    unit: Unit,
    logs_dir: Path,
    image: str | None,
    children: _Children,
    on_phase: Callable[[str], None],
) -> tuple[int, float]:
    started = time.monotonic()
    seed_prompt(unit)
    exit_code = run_task_process(
        child_argv(settings, unit.tag, unit.job_root, image), unit.job_root, logs_dir / unit.log_name, children, on_phase
    )
    return exit_code, time.monotonic() - started


def run_batch(
    settings: RunnerSettings,
    tags: list[str],
    jobs_dir: Path,
    workers: int,
    progress: Progress,
    *,
    image: str | None = None,
    attempts: int = 1,
) -> BatchSummary:
    """Run every tag (or attempt) not yet completed, ``workers`` at a time; the ledger after each.

    Raises:
        BadInputError: bad ``workers``, ``attempts`` or jobs directory, or another batch holds it.
    """
    jobs_dir = _checked_dir(jobs_dir, "--jobs-dir", "create it with DIR/<tag>/context/prompt.md per tag")
    check_attempts(attempts)
    return run_units(settings, batch_units(jobs_dir, tags, attempts), jobs_dir, workers, progress, image=image)


def run_attempts(
    settings: RunnerSettings, job_root: Path, attempts: int, workers: int, progress: Progress
) -> BatchSummary:
    """``--execute --job-root J --attempts K``: K attempts of the one tag, at ``J/attempt-<i>``, ledger at ``J``.

    Raises:
        BadInputError: bad ``workers``, ``attempts`` or job root, or another run holds it.
    """
    job_root = _checked_dir(job_root, "--job-root", "create it with context/prompt.md")
    units = attempt_units([settings.tag], check_attempts(attempts), lambda _tag: job_root)
    return run_units(settings, units, job_root, workers, progress, image=settings.resolved_image)


def _checked_dir(path: Path, flag: str, hint: str) -> Path:
    path = path.expanduser().resolve()
    if not SAFE_HOST_PATH.fullmatch(str(path)):
        raise BadInputError(f"{flag} must be a path of letters, digits and '_ . @ + / ~ -', without spaces")
    if not path.is_dir():
        raise BadInputError(f"{flag} does not exist; {hint}")
    return path


def run_units(
    settings: RunnerSettings,
    units: list[Unit],
    ledger_dir: Path,
    workers: int,
    progress: Progress,
    *,
    image: str | None,
) -> BatchSummary:
    """Each unit in its own process, ``workers`` at a time; one ledger (and one lock) in ``ledger_dir``."""
    if workers < 1 or workers > 64:
        raise BadInputError("--workers must be between 1 and 64")
    with job_root_lock(ledger_dir, name=BATCH_LOCK, what="batch"):
        return _run_locked(settings, units, ledger_dir, workers, progress, image)


def _run_locked(
    settings: RunnerSettings, units: list[Unit], jobs_dir: Path, workers: int, progress: Progress, image: str | None
) -> BatchSummary:
    ledger = RunLedger(jobs_dir, private_texts_for(jobs_dir))
    ledger_lock = threading.Lock()
    children = _Children()
    state_dir = settings.state_dir or default_state_dir()
    todo = [
        unit for unit in units
        if not (ledger.completed(unit.tag, unit.attempt) and evaluated(state_dir, JobRoot.at(unit.job_root, unit.tag)))
    ]
    for unit in units:
        if unit not in todo:
            progress.skipped(unit.name)
    ran: list[LedgerRow] = []
    started = time.monotonic()

    def task(unit: Unit) -> None:
        if children.stopping.is_set():
            return
        progress.started(unit.name)
        try:
            exit_code, wall = _run_one(
                settings, unit, jobs_dir / BATCH_LOGS, image, children, lambda phase: progress.phase(unit.name, phase)
            )
        except OSError as e:  # the task could not even start (no space for its log, say)
            log.error("task_not_started", task=unit.name, error_type=type(e).__name__)
            exit_code, wall = int(ExitCode.BAD_ENVIRONMENT), 0.0
        row = _row(unit, exit_code, wall, stopping=children.stopping.is_set())
        with ledger_lock:
            try:
                ledger.upsert(row)
            except (OSError, *REFUSALS) as e:  # the ledger could not be written: the task's own files stand
                log.error("ledger_not_written", task=unit.name, error_type=type(e).__name__)
            ran.append(row)
        progress.finished(row)

    interrupted = False
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="task")
    try:
        futures = [pool.submit(task, unit) for unit in todo]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for future in done:
            future.result()  # a coordinator bug surfaces here rather than vanishing
    except KeyboardInterrupt:
        interrupted = True
        children.stop_all()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if ledger.journal_entries:
            try:
                ledger.compact()  # the snapshot holds every row when the batch ends
            except (OSError, *REFUSALS) as e:
                log.error("ledger_not_written", error_type=type(e).__name__)
    interrupted = interrupted or any(row.state == "interrupted" for row in ran)
    phase_seconds: Counter[str] = Counter()
    for row in ran:
        phase_seconds.update(row.phase_durations_seconds)
    document = ledger.document()
    return BatchSummary(
        tags=len({unit.tag for unit in units}),
        skipped_completed=len(units) - len(todo),
        ran=len(ran),
        resolved=sum(1 for row in ran if row.resolved),
        failures_by_label=dict(Counter(row.failure_label or row.state for row in ran if not row.resolved)),
        states=dict(Counter(row.state for row in ran)),
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
    )


def _audit_labels(jobs_dir: Path) -> dict[str, str] | None:
    return read_audit_labels(jobs_dir)
