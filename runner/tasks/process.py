"""One task in a process of its own: ``python -m runner task --message-fd N``, started by the supervisor.

It reads its ``TaskRequest`` (``runner.tasks.protocol``) as JSON on stdin, runs the pipeline
on it and writes each phase it starts, then its outcome, as JSON lines to file
descriptor N. Its stderr is the task's log. SIGTERM and SIGINT take the Ctrl-C path.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import IO

import structlog
from pydantic import ValidationError

from runner.containment import signals
from runner.containment.parent_death import follow_batch_parent
from runner.containment.standard_streams import guard_standard_streams
from runner.entry import refused
from runner.errors import REFUSALS, BadInputError, ExitCode
from runner.jobroot import written_run
from runner.logs import configure_logging
from runner.pipeline import execute
from runner.tasks.protocol import PhaseStarted, TaskOutcome, TaskRequest
from runner.tasks.spec import resolve

log = structlog.get_logger(__name__)


def _channel(argv: list[str]) -> IO[str]:
    flag = next((arg for arg in argv if arg.startswith("--message-fd=")), "")
    fd = int(flag.removeprefix("--message-fd=") or "-1")
    if fd < 3:
        raise SystemExit("runner task: started by the supervisor only (--message-fd=N, N >= 3)")
    os.set_inheritable(fd, False)  # never to codex, git or any other process below this one
    return os.fdopen(fd, "w", encoding="utf-8", buffering=1)


def run(request: TaskRequest, send: Callable[[PhaseStarted], None] = lambda _message: None) -> TaskOutcome:
    """The task, in this process: a supervisor's child, or the CLI's own process for one
    ``--execute`` (which is then the task process: it owns every process below it).

    Raises:
        BadInputError, EnvironmentNotReadyError, JobRootUnwritableError: as ``pipeline.execute``.
    """
    if request.evaluation is not None:
        return evaluate_unit(request)
    settings = resolve(request.spec, request.host, job_root=request.job_root)
    # In the task's own (private) log: what this task runs with, whichever driver handed it over.
    if settings.image_pin is not None:  # the moment's pin (its driver's start, or submit): not the task's identity
        log.info("task_image_pinned", image=settings.image_name, ref=settings.image_pin)
    log.info("task_settings_resolved", tag=settings.tag, image=settings.image_name, source_dir=settings.source_dir,
             apply_cmd=settings.apply_cmd, test_cmd=settings.test_cmd, eval_network=settings.eval_network.value,
             eval_timeout=settings.eval_timeout, eval_probe=list(settings.probe_endpoints),
             codex_timeout=settings.codex_timeout, extract_timeout=settings.extract_timeout, model=settings.model,
             codex_profile=settings.codex_profile, codex_config=list(settings.codex_config),
             patch_exclude=list(settings.patch_exclude), from_profile=list(settings.profile_fields))
    result = execute(settings, on_phase=lambda phase: send(PhaseStarted(phase=phase)))
    return TaskOutcome(exit_code=result.exit_code, message=result.message, reduced=result.reduced,
                       run=written_run(settings.job_root))


def evaluate_unit(request: TaskRequest) -> TaskOutcome:
    """One fleet evaluation unit, in this process: the patch at ``job_root/<name>`` scored by
    ``runner.score_patches.score_units`` (``evaluate``'s own path) with the job root as its jobs dir.

    Raises:
        BadInputError, EnvironmentNotReadyError, JobRootBusyError: as ``evaluate``.
    """
    from runner.patch_sets import PatchUnit
    from runner.score_patches import UnitState, score_units

    unit = request.evaluation
    assert unit is not None
    settings = resolve(request.spec, request.host)
    patch = PatchUnit(tag=settings.tag, directory=unit.directory, name=unit.name, path=request.job_root / unit.name,
                      sha256=unit.sha256, size=unit.size, attempt=unit.attempt, rejection=unit.rejection)
    log.info("evaluation_unit_settings", tag=settings.tag, image=settings.resolved_image, apply_cmd=settings.apply_cmd,
             test_cmd=settings.test_cmd, eval_network=settings.eval_network.value, eval_timeout=settings.eval_timeout,
             eval_probe=list(settings.probe_endpoints))
    ledger, _rows, _skipped = score_units(request.job_root, [patch], {settings.tag: settings})
    row = ledger.rows[patch.key]
    failed = row.state is UnitState.INFRA_FAILED
    return TaskOutcome(exit_code=ExitCode.BAD_ENVIRONMENT if failed else ExitCode.COMPLETED,
                       message=f"the patch could not be run ({row.label})" if failed else None,
                       evaluation=row.model_dump(mode="json"))


def main(argv: list[str]) -> int:
    guard_standard_streams()
    configure_logging()
    signals.interrupt_from_now_on()
    follow_batch_parent()
    channel = _channel(argv)

    def send(message: PhaseStarted | TaskOutcome) -> None:
        try:
            channel.write(message.model_dump_json() + "\n")
        except OSError:
            pass  # the supervisor is gone; the lifeline ends this task

    try:
        if signals.pending() is not None:
            signals.raise_interrupt(signals.pending() or 0, None)
        try:
            request = TaskRequest.model_validate_json(sys.stdin.buffer.read())
        except ValidationError as e:
            raise BadInputError(f"the task request is not valid ({e.error_count()} problem(s))") from e
        outcome = run(request, send)
    except REFUSALS as e:
        outcome = TaskOutcome(exit_code=refused("runner", e), message=str(e))
    except KeyboardInterrupt:
        print("runner: interrupted; run the same command again to resume", file=sys.stderr)
        outcome = TaskOutcome(exit_code=int(ExitCode.INTERRUPTED), message="interrupted")
    else:
        if outcome.message:
            print(f"runner: {outcome.message}", file=sys.stderr)
    send(outcome)
    return int(outcome.exit_code)
