"""Every error the runner raises, under one root.

Invariant: ``str(error)`` is public-safe (no absolute host path, no secret, no
raw task text), so it can go straight into a report; each class carries the
exit code the CLI returns for it and a short ``reason`` code for markers.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

# What reducers/ raises has its own root there (reducers import nothing of runner/); it is
# re-exported here, so that errors are imported from one place, and mapped to exit codes below.
from reducers.errors import CompactInputError, PublicSafetyError, ReducerError  # noqa: F401 (re-exported)


class ExitCode(IntEnum):
    """The documented exit codes of ``python -m runner``."""

    COMPLETED = 0  # run completed (resolved or not), precheck healthy, plan/reduce done
    RUNNER_FAILURE = 1  # a phase failed; the compact outputs name it
    BAD_INPUT = 2  # flags, settings, tag, prompt or job root refused before any work
    BAD_ENVIRONMENT = 3  # Docker, the image or codex is not usable; precheck unhealthy
    INTERRUPTED = 130  # SIGINT or SIGTERM; containers removed, the marker says so; rerun resumes


class RunnerError(Exception):
    """Root of the runner's errors; ``reason`` is a short public code."""

    exit_code: ExitCode = ExitCode.RUNNER_FAILURE
    reason: str = "runner_error"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class BadInputError(RunnerError):
    """Input the operator can fix: a flag, a setting, the prompt, the job root."""

    exit_code = ExitCode.BAD_INPUT
    reason = "bad_input"


class JobRootBusyError(BadInputError):
    """Another run (or batch, or audit) holds the job root's lock; its pid is named."""

    reason = "job_root_locked"


class MessageError(BadInputError):
    """A fleet message (or a submission) that cannot become a task; names the fields, never their values."""

    reason = "bad_message"


class UnreadableFileError(BadInputError):
    """A file refused by the bounded reader (``runner.bounded_read``): ``unreadable`` says why (a
    closed set), ``name`` is relative to the directory it was read in; its text is never quoted.

    Its ``reason`` stays ``bad_input`` (a marker's reasons are a closed set; this never reaches one).
    """

    def __init__(self, name: str, unreadable: Any, hint: str) -> None:
        self.name = name
        self.unreadable = unreadable
        super().__init__(f"{name} is unreadable ({unreadable.value}): {hint}")


class NotAJobRootError(BadInputError):
    """``show``/``export``: the directory given holds no attempt (no prompt, no markers, no logs).

    Its ``reason`` stays ``bad_input``, as every refusal of the private views: none reaches a marker.
    """


class NoEventStreamError(BadInputError):
    """``export``: the attempt has no codex event stream to read (codex never ran, or its log is gone)."""


class InvalidTrajectoryError(BadInputError):
    """A document that is not an ATIF trajectory (``runner.trajectory.atif.validate_atif``); names the first problem."""


class EnvironmentNotReadyError(RunnerError):
    """The host cannot run the job: Docker down, image absent, codex missing."""

    exit_code = ExitCode.BAD_ENVIRONMENT
    reason = "bad_environment"


class DockerUnavailableError(EnvironmentNotReadyError):
    reason = "docker_unavailable"

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"the Docker daemon does not answer ({detail}); start it or set DOCKER_HOST",
        )


class ImageMissingError(EnvironmentNotReadyError):
    reason = "image_missing"

    def __init__(self, image: str) -> None:
        self.image = image
        if image.startswith("sha256:"):  # an id pinned by an earlier phase: no registry serves it by id
            message = (f"image {image}, which this job root's source was extracted from, is not present "
                       "locally; load that same image again, or start over in a fresh --job-root")
        else:
            message = (f"image {image} is not present locally; build or load it, "
                       "or pass --allow-pull (ALLOW_DOCKER_PULL=1) to pull it")
        super().__init__(message)


class ImageUnknownError(BadInputError):
    """The registry does not know the image (or may not give it): the operator's to fix, never retried."""

    reason = "image_unknown"

    def __init__(self, image: str, detail: str) -> None:
        self.image = image
        super().__init__(f"image {image} cannot be had from its registry ({detail}); check the name, the tag, "
                         "--image-repository and Docker's own login (docker login)")


class CodexNotFoundError(EnvironmentNotReadyError):
    reason = "codex_not_found"

    def __init__(self, codex_bin: str) -> None:
        super().__init__(
            f"codex binary {codex_bin!r} was not found; install @openai/codex or pass --codex-bin",
        )


class ClaudeCodeNotFoundError(EnvironmentNotReadyError):
    reason = "claude_code_not_found"

    def __init__(self, claude_bin: str) -> None:
        super().__init__(
            f"claude binary {claude_bin!r} was not found; install @anthropic-ai/claude-code or pass --claude-bin",
        )


class BrokerUnavailableError(EnvironmentNotReadyError):
    """The fleet's Redis does not answer; ``where`` is host:port/db, never a password."""

    reason = "broker_unavailable"

    def __init__(self, where: str, detail: str) -> None:
        super().__init__(f"the broker at {where} does not answer ({detail}); start Redis there or fix --broker")


class JobRootUnwritableError(EnvironmentNotReadyError):
    reason = "job_root_unwritable"

    def __init__(self, error: OSError) -> None:
        super().__init__(
            f"the job root cannot be written ({error.strerror or type(error).__name__}); "
            "free disk space or fix its permissions, then run again to resume",
        )


class SourceDirMissingError(EnvironmentNotReadyError):
    reason = "source_dir_missing"

    def __init__(self) -> None:
        super().__init__("the image has no buggy-source directory at the configured path; check --source-dir")


class UnscorableError(EnvironmentNotReadyError):
    """The tag's profile or its image says a verdict could not be trusted or reached: refused before codex."""

    def __init__(self, message: str, *, reason: str, refusal: str, tag_profile: str | None) -> None:
        super().__init__(message, reason=reason)
        self.refusal = refusal
        self.details: dict[str, object] = {"refusal": refusal, "tag_profile": tag_profile}


class CacheEntryError(RunnerError):
    """An extraction cache entry failed its check; the caller discards it and extracts again."""

    reason = "cache_entry_invalid"


class ProfileDataError(RunnerError):
    """The shipped tag profile file is broken: a packaging bug, named precisely."""

    reason = "tag_profiles_invalid"


class AgentNotContainedError(RunnerError):
    """Processes of the agent are still alive after SIGKILL: the attempt cannot be trusted."""

    reason = "agent_not_contained"


class PhaseError(RunnerError):
    """A phase ran and failed; the pipeline records it and stops there."""

    def __init__(
        self,
        phase: str,
        reason: str,
        message: str,
        *,
        exit_code: int | None = None,
        details: dict[str, object] | None = None,
    ) -> None:
        self.phase = phase
        self.exit_code_observed = exit_code
        self.details = details or {}
        super().__init__(f"{phase}: {message}", reason=reason)


class UnsafeArchiveError(PhaseError):
    def __init__(self, entry: str, why: str) -> None:
        self.entry = entry
        super().__init__(
            "extract",
            "unsafe_archive_entry",
            f"archive entry {entry!r} refused ({why}); the image's source tree is not safe to extract",
        )


class PhaseTimeoutError(PhaseError):
    """A runner phase (extract, baseline) passed its own deadline: the host, Docker or git was too
    slow or stuck, never the agent, so it is an infrastructure failure (exit 3); reason ``<phase>_timeout``."""

    exit_code = ExitCode.BAD_ENVIRONMENT

    def __init__(self, phase: str, seconds: float, flag: str) -> None:
        self.seconds = seconds
        super().__init__(
            phase,
            f"{phase}_timeout",
            f"the {phase} phase passed its deadline of {seconds:g}s ({flag}) and was ended; nothing it made "
            f"was kept and a rerun does the {phase} again (a stalled Docker daemon or git, or a tree too large: "
            f"raise {flag})",
        )


class TamperCheckError(PhaseError):
    """The tamper check itself failed: what the agent did cannot be verified, so the attempt is not trusted."""

    def __init__(self, step: str, error: BaseException) -> None:
        super().__init__(
            "codex",
            "tamper_check_failed",
            f"the runner's files could not be verified {step} codex ({type(error).__name__}); "
            "the attempt is not trusted",
        )


# Exit codes of the reducers' errors, where the runner calls them (any other: a runner failure).
_REDUCER_EXIT_CODES: dict[type[ReducerError], ExitCode] = {CompactInputError: ExitCode.BAD_INPUT}
# What an entry point answers with an exit code and a message, never a traceback.
REFUSALS: tuple[type[Exception], ...] = (RunnerError, ReducerError)


def exit_code_of(error: RunnerError | ReducerError) -> ExitCode:
    if isinstance(error, RunnerError):
        return error.exit_code
    return next((code for kind, code in _REDUCER_EXIT_CODES.items() if isinstance(error, kind)), ExitCode.RUNNER_FAILURE)


def first_problem(error: Any) -> str:
    """A pydantic ValidationError's first problem, ``where.in.the.data: what``, for a data file's refusal."""
    first = error.errors()[0]
    return f"{'.'.join(str(part) for part in first['loc'])}: {first['msg']}"
