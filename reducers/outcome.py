"""A finished task's facts, from its compact run and its exit code: one rule for every ledger and view.

The batch's ledger, the fleet's ledger and the suite views all build their rows on
``TaskFacts`` through ``task_facts``, so they cannot disagree on a task's state, its
verdict or whether an infrastructure failure (not the agent) ended it.

States:
- ``done``: scored, the agent had its say: evaluated (resolved or not), or the agent
  failed (codex failed or timed out, an empty patch, a forged file): unresolved;
- ``failed``: not scored: the operator's input was refused, or the host, Docker, git,
  the model provider or the runner broke (``infra_failure``);
- ``cancelled``: interrupted by the operator (Ctrl-C, a drain, ``cancel``);
- ``skipped_budget``: never started: the suite's budget (``--suite-budget-usd``) was spent;
  a rerun with a larger budget takes it;
- ``queued`` and ``running`` are the fleet's, before a task ends;
- ``unreadable`` is the views': a row whose file or record was refused when read.

Pure: imports nothing of the runner, touches no file.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field

from reducers.compact import BenchmarkRun
from reducers.models import Frozen
from reducers.passk import infra_label

# The exit codes of a task process (runner.errors.ExitCode, which reducers do not import).
EXIT_COMPLETED, EXIT_RUNNER_FAILURE, EXIT_BAD_INPUT, EXIT_BAD_ENVIRONMENT, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
SIGNALS_OF_A_STOP = (-15, -2, -9)  # SIGTERM, SIGINT, SIGKILL: how a stopped task's process may end
# The label of a task that ended without a compact run to name its failure.
_LABEL_WITHOUT_RUN = {EXIT_BAD_INPUT: "bad_input", EXIT_BAD_ENVIRONMENT: "bad_environment"}


class TaskState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED_BUDGET = "skipped_budget"
    UNREADABLE = "unreadable"  # a view's row whose record was refused when read (the views say why)


FINAL_STATES = frozenset({TaskState.DONE, TaskState.FAILED, TaskState.CANCELLED})
FINISHED_STATES = frozenset({TaskState.DONE, TaskState.FAILED})


class TaskFacts(Frozen):
    """What every ledger row says of a task: how it ended, its verdict, what it took.

    Public-safe by construction: counts, hashes, ids, labels from closed sets.
    """

    state: TaskState
    exit_code: int | None = None  # the task process's (negative: a signal ended it)
    resolved: bool | None = None  # the official score; None until scored
    first_failed_phase: str | None = None
    failure_label: str | None = None
    infra_failure: bool = False
    wall_seconds: float | None = None
    phase_durations_seconds: dict[str, float] = Field(default_factory=dict)
    patch_sha256: str | None = None
    patch_bytes: int | None = None
    image_digest: str | None = None
    image_id: str | None = None
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    # resolved is the official score; the runner's exit-code verdict and the trust in it beside it.
    exit_code_verdict: bool | None = None
    verdict_untrusted: bool = False
    # What the attempt cost on its rate card (None: unknown: no compact run, or a model the card lacks).
    cost_usd: float | None = None
    model: str | None = None
    budget_exceeded: bool = False  # a live cap stopped codex; the attempt was still scored
    agent: str | None = None  # which agent made the attempt (runner.agents); None: unknown, or codex before the seam

    @property
    def spent_tokens(self) -> bool:
        return self.input_tokens + self.output_tokens > 0

    @property
    def scored(self) -> bool:
        """Counts in pass@k and the resolved rates: the agent had its say."""
        return self.state is TaskState.DONE

    @property
    def evaluated(self) -> bool:
        """The run got its verdict from an evaluation (exit 0): a batch's rerun skips it."""
        return self.state is TaskState.DONE and self.exit_code == EXIT_COMPLETED


def task_facts(
    run: BenchmarkRun | None, exit_code: int | None, wall_seconds: float | None, *, stopping: bool = False
) -> TaskFacts:
    """The facts of a task whose process ended with ``exit_code`` having written ``run`` (or not).

    ``stopping``: its driver was stopping it, so a signal's end is an interrupt, not a crash.
    """
    label = run.failure_attribution_labels[0] if run is not None and run.failure_attribution_labels else None
    from_run: dict[str, Any] = {} if run is None else {
        "first_failed_phase": run.first_failed_phase,
        "phase_durations_seconds": run.phase_durations_seconds,
        "patch_sha256": run.patch_sha256 if run.patch_bytes else None,
        "patch_bytes": run.patch_bytes,
        "image_digest": run.image_digest,
        "image_id": run.image_id,
        "input_tokens": run.metrics.input_tokens,
        "cached_input_tokens": run.metrics.cache_tokens,
        "output_tokens": run.metrics.output_tokens,
        "exit_code_verdict": run.evaluation.exit_code_verdict if run.evaluation.ran else None,
        "verdict_untrusted": run.verdict_untrusted,
        "cost_usd": run.metrics.cost_usd,
        "model": run.codex.model,
        "budget_exceeded": run.codex.budget_exceeded,
        "agent": run.agent,
    }
    common = {"exit_code": exit_code, "wall_seconds": wall_seconds, **from_run}
    if exit_code == EXIT_INTERRUPTED or (stopping and exit_code in SIGNALS_OF_A_STOP):
        return TaskFacts(state=TaskState.CANCELLED, failure_label=label, **common)
    if exit_code == EXIT_COMPLETED and run is not None:
        resolved = run.official_task_score.resolved
        return TaskFacts(state=TaskState.DONE, resolved=resolved, failure_label=None if resolved else label, **common)
    if exit_code == EXIT_BAD_INPUT:
        return TaskFacts(state=TaskState.FAILED, failure_label=label or "bad_input", **common)
    agents = exit_code == EXIT_RUNNER_FAILURE and run is not None and not run.infra_failure and not infra_label(label)
    if agents:  # codex failed or timed out, an empty patch, ...: scored, unresolved
        return TaskFacts(state=TaskState.DONE, resolved=False, failure_label=label, **common)
    fallback = _LABEL_WITHOUT_RUN.get(exit_code, f"exit_{exit_code}") if exit_code is not None else "no_exit_code"
    return TaskFacts(state=TaskState.FAILED, failure_label=label or fallback, infra_failure=True, **common)
