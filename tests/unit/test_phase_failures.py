"""Every exception a phase can raise, as its marker's fields and the run's exit code; reducers stay pure."""

from __future__ import annotations

import ast
import errno
from pathlib import Path

import pytest
from docker.errors import APIError
from git import GitCommandError
from requests.exceptions import ConnectionError as RequestsConnectionError

from reducers.errors import CompactInputError, PublicSafetyError, ReducerError
from reducers.models import Phase
from runner.errors import (
    DockerUnavailableError,
    ExitCode,
    JobRootUnwritableError,
    PhaseError,
    RunnerError,
    exit_code_of,
)
from runner.pipeline import phase_failure

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("raised", "reason", "reported", "exit_code", "keeps_traceback"),
    [
        (PhaseError("codex", "codex_timeout", "codex ran out of time", exit_code=124, details={"seconds": 4}),
         "codex_timeout", PhaseError, ExitCode.RUNNER_FAILURE, False),
        (RequestsConnectionError("Connection aborted"), "docker_unavailable", DockerUnavailableError,
         ExitCode.BAD_ENVIRONMENT, False),
        (APIError("500 Server Error", explanation="no space left"), "docker_error", RunnerError,
         ExitCode.RUNNER_FAILURE, False),
        (GitCommandError(["git", "add"], 128, b"fatal: /home/someone/x"), "git_error", RunnerError,
         ExitCode.RUNNER_FAILURE, True),
        (OSError(errno.ENOSPC, "No space left on device"), "job_root_unwritable", JobRootUnwritableError,
         ExitCode.BAD_ENVIRONMENT, False),
        (OSError(errno.ENOENT, "No such file"), "os_error", RunnerError, ExitCode.RUNNER_FAILURE, False),
        (CompactInputError("result-markers/patch.json", "details", "not a number"), "bad_compact_input",
         CompactInputError, ExitCode.BAD_INPUT, False),
        (PublicSafetyError("benchmark_run.compact.json", "note", "absolute host path"), "public_safety_violation",
         PublicSafetyError, ExitCode.RUNNER_FAILURE, False),
        (ValueError("a bug"), "internal_error", RunnerError, ExitCode.RUNNER_FAILURE, True),
    ],
)
def test_each_kind_of_failure_has_its_marker_and_exit_code(
    raised: BaseException, reason: str, reported: type, exit_code: ExitCode, keeps_traceback: bool
) -> None:
    failure = phase_failure(Phase.EXTRACT, raised)
    assert failure.reason == reason
    assert type(failure.error) is reported
    assert exit_code_of(failure.error) == exit_code
    assert failure.keep_traceback is keeps_traceback
    assert "/home/someone" not in str(failure.error)  # git's own text stays in the private log


def test_a_phase_error_keeps_the_observed_exit_code_and_its_scalar_details() -> None:
    error = PhaseError("codex", "codex_failed", "codex failed", exit_code=3, details={"n": 1, "nested": {"x": 1}})
    failure = phase_failure(Phase.CODEX, error)
    assert failure.exit_code_observed == 3 and failure.details == {"n": 1}


def test_an_interrupt_is_recorded_as_interrupted() -> None:
    failure = phase_failure(Phase.CODEX, KeyboardInterrupt())
    assert failure.reason == "interrupted" and isinstance(failure.error, KeyboardInterrupt)


def test_reducers_import_nothing_of_the_runner() -> None:
    """reducers/ is pure: its errors have their own root, and the runner maps them to exit codes."""
    offenders = []
    for path in sorted((REPO / "reducers").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {name}" for name in names if name == "runner" or name.startswith("runner.")]
    assert offenders == []
    assert not issubclass(ReducerError, RunnerError)
