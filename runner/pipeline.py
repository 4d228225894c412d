"""The pipeline: the phases in order, a marker each, resume from ``ok`` markers, always reduce.

Invariants:
- a phase whose ``ok`` marker the runner's journal records (``runner.journal``,
  outside the job root) is skipped; marker files are only its copies, and a patch
  or an evaluation counts only while it is of the patch on disk (``_done``);
- before any phase, an agent a dead run left is ended (``recover``);
- the first failure stops the run and
  is recorded in that phase's marker; reduce then runs whatever happened, so
  every run that got past prepare ends with compact outputs naming the failure;
- a refused prompt (prepare) writes nothing at all;
- later phases take their inputs from earlier markers, which is what makes a
  stopped run resumable.
"""

from __future__ import annotations

import errno
import traceback
from collections.abc import Callable
from typing import Any, TypeVar
from dataclasses import dataclass, field

import structlog
from docker.errors import DockerException
from git import GitError
from pydantic import ValidationError
from structlog.contextvars import bound_contextvars

from reducers.models import (
    PHASE_ORDER,
    RESULTS,
    BaselineResult,
    EvaluateResult,
    ExtractResult,
    Marker,
    PatchResult,
    Phase,
    PhaseResult,
    Reason,
    Scalar,
)
from runner.agents import AgentName
from runner.context import JobContext
from runner.errors import (
    BadInputError,
    DockerUnavailableError,
    EnvironmentNotReadyError,
    ExitCode,
    JobRootUnwritableError,
    PhaseError,
    REFUSALS,
    RunnerError,
    exit_code_of,
)
from runner.atomic import open_private
from runner.containment.agent import end_agent
from runner.context import sha256_file
from runner.gitops import release_stale_git_locks
from runner.journal import Journal, PhaseClock, default_state_dir, load_marker, write_marker
from runner.containment.descendants import kill_descendants
from runner.docker_utils import daemon_gone, sweep_strays
from runner.lock import job_root_lock
from runner.phases.baseline import baseline
from runner.phases.agent import agent
from runner.phases.evaluate import evaluate
from runner.phases.extract import extract
from runner.phases.patch import export_patch
from runner.phases.precheck import precheck
from runner.phases.prepare import prepare, read_prompt, source_dir_digest
from runner.phases.reduce import ReduceResult, reduce_job
from runner.settings import RunnerSettings
from runner.jobroot import JobRoot

log = structlog.get_logger(__name__)

R = TypeVar("R", bound=PhaseResult)

ERROR_LOG = "runner-error.log"
# A job root that cannot take more bytes is the environment's fault, not the phase's.
UNWRITABLE_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EPERM})


@dataclass(frozen=True)
class RunOutcome:
    """A run's result (what reduce found) and what the process should exit with."""

    reduced: ReduceResult
    exit_code: ExitCode  # how the CLI exits for it: completed, refused, interrupted
    message: str | None = None


def _recorded(ctx: JobContext, contract: type[R]) -> R:
    """An earlier phase's ``ok`` result, which a later phase takes its input from."""
    phase = contract.phase
    marker = ctx.journal.marker(phase) if ctx.journal is not None else load_marker(ctx.job.markers, phase)
    if marker is None or not marker.ok:
        raise PhaseError(phase.value, "missing_input", f"no ok {phase.value} marker; rerun that phase")
    return marker.details


def _given(value: str | None, phase: Phase, what: str) -> str:
    if not value:
        raise PhaseError(phase.value, "missing_input", f"the {phase.value} marker lacks {what}; rerun that phase")
    return value


def _patch(ctx: JobContext) -> PatchResult:
    return export_patch(ctx, _given(_recorded(ctx, BaselineResult).baseline_commit, Phase.BASELINE, "its commit"))


def _evaluate(ctx: JobContext) -> EvaluateResult:
    return evaluate(ctx, _given(_recorded(ctx, ExtractResult).image_id, Phase.EXTRACT, "the image id"))


_STEP_FUNCTIONS: dict[Phase, Callable[[JobContext], PhaseResult]] = {
    Phase.PREPARE: prepare,
    Phase.PRECHECK: precheck,
    Phase.EXTRACT: extract,
    Phase.BASELINE: baseline,
    Phase.CODEX: agent,
    Phase.PATCH: _patch,
    Phase.EVALUATE: _evaluate,
}
# In PHASE_ORDER; reduce is not a step: it always runs, after them.
STEPS = {phase: _STEP_FUNCTIONS[phase] for phase in PHASE_ORDER if phase is not Phase.REDUCE}


def _scalars(details: dict[str, object]) -> dict[str, Scalar]:
    return {k: v for k, v in details.items() if v is None or isinstance(v, (str, int, float, bool))}


def _check_same_task(job: JobRoot, settings: RunnerSettings) -> None:
    """A job root belongs to one tag, image, source dir and agent: a rerun must resume the same task
    (another agent would find the first one's attempt recorded ok, and report it as its own)."""
    prepared = load_marker(job.markers, Phase.PREPARE)
    if prepared is None:
        return
    recorded = prepared.details
    for flag, was, wanted in (
        ("--tag", recorded.tag, settings.tag),
        ("--image", recorded.image, settings.image_name),
        ("--source-dir", recorded.source_dir_sha256, source_dir_digest(settings)),
        ("--agent", recorded.agent or AgentName.CODEX.value, settings.agent.value),
    ):
        if was != wanted:
            raise BadInputError(
                f"this job root was prepared with another {flag}; use another --job-root or the same settings"
            )


def _keep_traceback(ctx: JobContext, error: BaseException) -> None:
    """The full traceback goes to a private log only: it may name host paths."""
    try:
        with open_private(ctx.job.logs / ERROR_LOG) as sink:
            sink.write("".join(traceback.format_exception(error)).encode())
    except OSError:
        pass  # the job root itself is failing; the marker still says internal_error


@dataclass(frozen=True)
class PhaseFailure:
    """What a failed phase's marker records, and the error the run reports for it."""

    reason: str
    error: BaseException  # public-safe message; its exit code is the run's
    exit_code_observed: int | None = None  # the phase's own process (codex, the test), if any
    details: dict[str, Any] = field(default_factory=dict)
    keep_traceback: bool = False  # its text may name host paths: logs/runner-error.log only

    def result(self, phase: Phase) -> PhaseResult:
        """The failed phase's typed result, as its marker stores it.

        A reason or detail the schema does not know is the runner's bug: the marker
        then says ``internal_error`` (with the error's type) rather than the run losing it.
        """
        contract = RESULTS[phase]
        try:
            return contract.model_validate({**self.details, "reason": self.reason, "exit_code": self.exit_code_observed})
        except ValidationError as e:
            log.error("failure_outside_the_schema", reason=self.reason, fields=sorted(self.details),
                      problem=e.errors()[0]["type"])
            return contract(reason=Reason.INTERNAL_ERROR, exit_code=self.exit_code_observed,
                            error_type=type(self.error).__name__)


def phase_failure(phase: Phase, error: BaseException) -> PhaseFailure:
    """Any exception a phase raised, as its marker's fields: one table, as docker-py's
    ``create_api_error_from_http_exception`` turns any HTTP error into its exception."""
    if isinstance(error, Exception) and not isinstance(error, REFUSALS) and daemon_gone(error):
        error = DockerUnavailableError(f"it stopped answering during {phase.value}: {type(error).__name__}")
    kind = {"error_type": type(error).__name__}
    if isinstance(error, PhaseError):
        return PhaseFailure(error.reason, error, error.exit_code_observed, _scalars(error.details))
    if isinstance(error, REFUSALS):
        return PhaseFailure(error.reason, error, details=_scalars(getattr(error, "details", None) or {}))
    if isinstance(error, KeyboardInterrupt):
        return PhaseFailure("interrupted", error)
    if isinstance(error, DockerException):
        explanation = str(getattr(error, "explanation", "") or "")[:200]
        message = f"{phase.value}: Docker failed ({type(error).__name__}: {explanation})"
        return PhaseFailure("docker_error", RunnerError(message, reason="docker_error"), details=kind)
    if isinstance(error, GitError):  # git's own message (stderr) names paths: kept privately
        message = f"{phase.value}: git failed ({type(error).__name__}); the details are in logs/{ERROR_LOG}"
        return PhaseFailure("git_error", RunnerError(message, reason="git_error"), details=kind, keep_traceback=True)
    if isinstance(error, OSError):
        if error.errno in UNWRITABLE_ERRNOS:
            reported: RunnerError = JobRootUnwritableError(error)
        else:
            reported = RunnerError(
                f"{phase.value}: a file operation failed ({error.strerror or type(error).__name__})", reason="os_error"
            )
        return PhaseFailure(reported.reason, reported, details=kind)
    # A bug or an unforeseen failure: still recorded, reduced and reported.
    message = f"{phase.value}: unexpected {type(error).__name__}; the traceback is in logs/{ERROR_LOG}"
    return PhaseFailure("internal_error", RunnerError(message, reason="internal_error"), details=kind, keep_traceback=True)


def _run_phase(ctx: JobContext, phase: Phase) -> tuple[Marker, BaseException | None]:
    """Run one phase and turn whatever happens into its marker."""
    clock = PhaseClock(phase)
    log.info("phase_started")
    try:
        result = STEPS[phase](ctx)
    except (Exception, KeyboardInterrupt) as e:
        if isinstance(e, KeyboardInterrupt):
            kill_descendants()  # the runner's own children (a `git add` half-way) end with the phase
        failure = phase_failure(phase, e)
        if failure.keep_traceback:
            _keep_traceback(ctx, e)
        marker = clock.marker(failure.result(phase), ok=False)
        error: BaseException | None = failure.error
    else:
        marker = clock.marker(result)
        error = None
    log.info("phase_finished", status=marker.status.value, reason=marker.reason, duration_seconds=marker.duration_seconds)
    return marker, error


def execute(settings: RunnerSettings, *, on_phase: Callable[[Phase], None] | None = None) -> RunOutcome:
    """The full run on ``settings.job_root``; ``on_phase`` hears each phase as it starts (a supervisor's task).

    Raises:
        BadInputError: the prompt is refused, the job root belongs to another task
            or another run holds it (nothing is written then).
        JobRootUnwritableError: a marker or public file cannot be written (disk full,
            read-only); atomic writes leave no half-written file.
    """
    if settings.job_root is None:
        raise BadInputError("--execute needs --job-root DIR (or JOB_ROOT)")
    job = JobRoot.at(settings.job_root, settings.tag)
    ctx = JobContext(settings=settings, job=job)
    with bound_contextvars(run_id=ctx.run_id, tag=settings.tag):
        read_prompt(ctx)  # a refused prompt: nothing is written, not even the lock
        _check_same_task(job, settings)
        try:
            with job_root_lock(job.root):
                ctx.journal = Journal.open(settings.state_dir or default_state_dir(), job)
                ctx.job_id = ctx.journal.job_id
                with bound_contextvars(job_id=ctx.job_id):
                    recover(ctx)
                    failure = _run_phases(ctx, on_phase or (lambda _phase: None))
                with bound_contextvars(phase=Phase.REDUCE.value):
                    _sync_markers(ctx)
                    reduced = _reduce(job)
        except OSError as e:
            raise JobRootUnwritableError(e) from e
    return _outcome(reduced, failure)


def _sweep_own_strays(ctx: JobContext) -> None:
    """Containers of this job root left by a run that died (SIGKILL, power loss)."""
    try:
        removed, _kept = sweep_strays(ctx.docker(), job_id=ctx.job_id)
    except EnvironmentNotReadyError:
        return  # no Docker: the precheck phase reports it
    if removed:
        log.warning("stray_containers_removed", count=removed)


def _run_phases(ctx: JobContext, on_phase: Callable[[Phase], None]) -> BaseException | None:
    """Every phase not yet ``ok``, in order, until the first failure (returned, not raised)."""
    job = ctx.job
    try:
        _sweep_own_strays(ctx)
        for phase in STEPS:
            with bound_contextvars(phase=phase.value):
                if _done(ctx, phase):
                    log.info("phase_skipped", reason="ok in the runner's journal from an earlier run")
                    continue
                on_phase(phase)
                marker, failure = _run_phase(ctx, phase)
                write_marker(job.markers, marker)
                ctx.journal.record(marker)  # then the journal: a file no journal records is never trusted
                if failure is not None:
                    return failure
    finally:
        ctx.close()
    return None


def _done(ctx: JobContext, phase: Phase) -> bool:
    """Is ``phase`` recorded ``ok`` in the journal, and does what it made still hold?

    The patch must still be the file the patch phase wrote, and the evaluation must
    be of that very patch; otherwise both are made again.
    """
    journal = ctx.journal
    marker = journal.marker(phase)
    if marker is None or not marker.ok:
        return False
    if phase is Phase.PATCH:
        patch = ctx.job.patch
        held = patch.is_file() and not patch.is_symlink() and sha256_file(patch) == marker.details.patch_sha256
        if not held:
            log.warning("recorded_patch_not_on_disk", action="the patch is made again and evaluated again")
            journal.forget(Phase.PATCH, Phase.EVALUATE)
        return held
    if phase is Phase.EVALUATE:
        patched = journal.marker(Phase.PATCH)
        if patched is None or marker.details.patch_sha256 != patched.details.patch_sha256:
            journal.forget(Phase.EVALUATE)
            return False
    return True


def recover(ctx: JobContext) -> None:
    """Before any phase: no agent of a dead run is alive, the runner's files are its own again.

    Raises:
        EnvironmentNotReadyError: a dead run's agent cannot be ended.
    """
    journal, job = ctx.journal, ctx.job
    unwatched = journal.unwatched_agent()
    if unwatched is not None:
        if not end_agent(unwatched):
            raise EnvironmentNotReadyError(
                "the agent of a run that died is still running and cannot be killed; "
                "end it (or reboot) before running this job root again",
                reason="dead_runs_agent_alive",
            )
        log.warning("unwatched_agent_found", action="its processes are gone; codex runs again, nothing it wrote is trusted")
        journal.agent_ended()
    release_stale_git_locks(job.baseline_git_dir)
    _sync_markers(ctx)


def _sync_markers(ctx: JobContext) -> None:
    replaced = ctx.journal.sync_files(ctx.job.markers, tuple(STEPS))
    if replaced:
        log.warning("untrusted_markers_replaced", count=len(replaced), first=replaced[0])


def _reduce(job: JobRoot) -> ReduceResult:
    clock = PhaseClock(Phase.REDUCE)
    log.info("phase_started")
    result = reduce_job(job)
    write_marker(job.markers, clock.marker(result))
    log.info("phase_finished", status="ok", resolved=result.resolved, failure_label=result.failure_label)
    return result


def _outcome(reduced: ReduceResult, failure: BaseException | None) -> RunOutcome:
    if isinstance(failure, KeyboardInterrupt):
        code, message = ExitCode.INTERRUPTED, "interrupted; run the same command again to resume"
    elif isinstance(failure, REFUSALS):
        code, message = exit_code_of(failure), str(failure)
    else:
        code, message = ExitCode.COMPLETED, None
    return RunOutcome(reduced=reduced, exit_code=code, message=message)
