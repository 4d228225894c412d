"""The schema the runner writes and the reducers read: phases, the typed result of each, markers.

Each phase returns one frozen result model; its marker stores that very model under
``details`` and the next phases and the reducers read its attributes, never keys.
Reasons, terminal states and ledger states are enums: their values are the public
vocabulary (``failed_<phase>_<reason>`` labels, ``terminal_state``, ledger ``state``).

Pure: imports neither docker nor git, touches no file.
"""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import Any, ClassVar, Generic, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Frozen(BaseModel):
    """Every value object of the runner and the reducers: immutable, and no field it does not know."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Phase(str, Enum):
    PREPARE = "prepare"
    PRECHECK = "precheck"
    EXTRACT = "extract"
    BASELINE = "baseline"
    CODEX = "codex"
    PATCH = "patch"
    EVALUATE = "evaluate"
    REDUCE = "reduce"


# The order of a full run; reduce always runs, the others resume from their markers.
PHASE_ORDER: tuple[Phase, ...] = tuple(Phase)


class MarkerStatus(str, Enum):
    OK = "ok"
    FAILED = "failed"


class Reason(StrEnum):
    """Why a phase ended as it did: ``ok``, or the code its failure label carries."""

    OK = "ok"
    EVAL_TIMEOUT = "eval_timeout"  # an ok evaluate whose test ran out of time
    # codex
    CODEX_TIMEOUT = "codex_timeout"
    CODEX_MODEL_ERROR = "codex_model_error"
    CODEX_EXIT_NONZERO = "codex_exit_nonzero"
    CODEX_REPLACED_SOURCE = "codex_replaced_source"
    CODEX_WROTE_RUNNER_FILES = "codex_wrote_runner_files"
    AGENT_NOT_CONTAINED = "agent_not_contained"
    # the source tree, the patch, the inputs of a phase
    EMPTY_SOURCE = "empty_source"
    SOURCE_DIR_IS_SYMLINK = "source_dir_is_symlink"
    SOURCE_DIR_MISSING = "source_dir_missing"
    UNSAFE_ARCHIVE_ENTRY = "unsafe_archive_entry"
    CACHE_ENTRY_INVALID = "cache_entry_invalid"
    # a runner phase past its own deadline (runner.deadline): an infrastructure failure
    EXTRACT_TIMEOUT = "extract_timeout"
    BASELINE_TIMEOUT = "baseline_timeout"
    PATCH_TOO_LARGE = "patch_too_large"
    EMPTY_PATCH = "empty_patch"
    PATCH_MISSING = "patch_missing"
    MISSING_INPUT = "missing_input"
    # precheck, one per check (runner.phases.precheck.CHECK_NAMES)
    PRECHECK_CODEX_BINARY = "precheck_codex_binary"
    PRECHECK_CODEX_LOGIN = "precheck_codex_login"
    PRECHECK_CLAUDE_CODE_BINARY = "precheck_claude_code_binary"
    PRECHECK_CLAUDE_CODE_LOGIN = "precheck_claude_code_login"
    PRECHECK_GIT_BINARY = "precheck_git_binary"
    PRECHECK_DOCKER_DAEMON = "precheck_docker_daemon"
    PRECHECK_IMAGE_PRESENT = "precheck_image_present"
    PRECHECK_IMAGE_HAS_SOURCE_DIR = "precheck_image_has_source_dir"
    PRECHECK_ENTRYPOINT_KNOWS_APPLY_PATCH = "precheck_entrypoint_knows_apply_patch"
    PRECHECK_ENTRYPOINT_KNOWS_TEST_PATCHED = "precheck_entrypoint_knows_test_patched"
    PRECHECK_TAG_SCORABLE = "precheck_tag_scorable"
    # the environment and the runner's own errors (runner.errors)
    RUNNER_ERROR = "runner_error"
    BAD_INPUT = "bad_input"
    BAD_ENVIRONMENT = "bad_environment"
    BAD_COMPACT_INPUT = "bad_compact_input"
    BAD_MESSAGE = "bad_message"
    PUBLIC_SAFETY_VIOLATION = "public_safety_violation"
    DOCKER_UNAVAILABLE = "docker_unavailable"
    IMAGE_MISSING = "image_missing"
    IMAGE_PULL_FAILED = "image_pull_failed"
    IMAGE_PULL_STALLED = "image_pull_stalled"
    IMAGE_PIN_UNAVAILABLE = "image_pin_unavailable"
    IMAGE_REGISTRY_UNREACHABLE = "image_registry_unreachable"
    IMAGE_UNKNOWN = "image_unknown"
    CODEX_NOT_FOUND = "codex_not_found"
    CLAUDE_CODE_NOT_FOUND = "claude_code_not_found"
    BROKER_UNAVAILABLE = "broker_unavailable"
    JOB_ROOT_LOCKED = "job_root_locked"
    JOB_ROOT_UNWRITABLE = "job_root_unwritable"
    TAG_PROFILES_INVALID = "tag_profiles_invalid"
    DEAD_RUNS_AGENT_ALIVE = "dead_runs_agent_alive"
    CANARY_BASE_IMAGE_MISSING = "canary_base_image_missing"
    CANARY_BUILD_FAILED = "canary_build_failed"
    CANARY_STUB_MISSING = "canary_stub_missing"
    # any exception of a phase (runner.pipeline.phase_failure)
    INTERRUPTED = "interrupted"
    DOCKER_ERROR = "docker_error"
    GIT_ERROR = "git_error"
    OS_ERROR = "os_error"
    INTERNAL_ERROR = "internal_error"


class TerminalState(StrEnum):
    """How a run ended, as ``benchmark_result.compact.json`` says it."""

    RESOLVED = "resolved"
    EVALUATED_UNRESOLVED = "evaluated_unresolved"
    RUNNER_FAILED = "runner_failed"


Scalar = Union[str, int, float, bool, None]


class PhaseResult(BaseModel):
    """What a phase hands the pipeline and its marker stores under ``details``.

    ``reason`` and ``exit_code`` are the marker's own fields: left out of ``details`` on
    disk, put back from the marker when it is read, so ``details.reason`` never disagrees.
    ``error_type`` is the exception's class on a failed marker the exception itself did
    not describe (a Docker, git, file or internal error).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    phase: ClassVar[Phase]
    reason: Reason = Field(default=Reason.OK, exclude=True)
    exit_code: int | None = Field(default=None, exclude=True)
    error_type: str | None = None


class PrepareResult(PhaseResult):
    phase = Phase.PREPARE
    tag: str = ""
    image: str = ""
    prompt_sha256: str = ""
    prompt_bytes: int = 0
    source_dir_sha256: str = ""
    agent: str | None = None  # the agent the job root is for (runner.agents); None: prepared before the seam, codex


class PrecheckResult(PhaseResult):
    phase = Phase.PRECHECK
    codex_version: str | None = None
    # The agent checked (runner.agents.AgentName) and its version; None: codex (codex_version).
    agent: str | None = None
    agent_version: str | None = None
    image_id: str | None = None
    checks_passed: int = 0
    tag_profile: str | None = None
    refusal: str | None = None  # the reason label when the tag cannot be scored
    unscorable_override: bool = False


class ExtractResult(PhaseResult):
    phase = Phase.EXTRACT
    image_id: str | None = None
    image_digest: str | None = None
    file_count: int = 0
    directory_count: int = 0
    symlink_count: int = 0
    byte_count: int = 0
    oracle_entries_skipped: int = 0
    oracle_entries_extracted: int = 0
    from_cache: bool = False


class BaselineResult(PhaseResult):
    phase = Phase.BASELINE
    baseline_commit: str | None = None
    tracked_file_count: int = 0


class CodexResult(PhaseResult):
    phase = Phase.CODEX
    timed_out: bool = False
    duration_seconds: float = 0.0
    stdout_sha256: str = ""
    stderr_sha256: str = ""
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    last_message_present: bool = False
    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    output_tokens: int = 0
    reasoning_output_tokens: int = 0
    turns: int = 0
    failed_turns: int = 0
    model_error: str | None = None
    infra_failure: bool = False
    model: str | None = None
    codex_overrides_sha256: str = ""
    runner_files_touched: int = 0  # codex_wrote_runner_files: how many of the runner's files it wrote
    # What the tokens cost on the rate card (runner.pricing); None: the card does not know the model.
    cost_usd: float | None = None
    cost_known: bool = False
    rate_card_sha256: str = ""
    # A live cap (--max-tokens, --max-cost-usd) stopped codex; the attempt goes on to be scored.
    budget_exceeded: bool = False
    budget_reason: Literal["max_tokens", "max_cost_usd"] | None = None
    # Which agent ran (runner.agents.AgentName); None: a marker from before the agent seam (codex).
    agent: str | None = None


class PatchResult(PhaseResult):
    phase = Phase.PATCH
    patch_sha256: str | None = None
    patch_bytes: int = 0
    changed_file_count: int = 0
    added_file_count: int = 0
    deleted_file_count: int = 0
    hunk_count: int = 0
    binary_change_count: int = 0
    sensitive_file_count: int = 0
    artifact_files_left_out: int = 0
    patch_max_bytes: int | None = None  # patch_too_large: the bound it crossed
    file_max_bytes: int | None = None  # patch_too_large before any read: the per-file bound
    files_over_limit: int | None = None  # how many changed files were past it


class EvaluateResult(PhaseResult):
    phase = Phase.EVALUATE
    image_id: str | None = None
    network: str | None = None
    apply_exit_code: int | None = None
    test_exit_code: int | None = None
    timed_out: bool = False
    resolved: bool = False  # the official score
    exit_code_verdict: bool = False  # the runner's own: the container's exit code alone
    string_verdict: bool | None = None  # the official rule's string part, on stdout alone
    verdicts_disagree: bool = False
    apply_seconds: float | None = None
    test_seconds: float | None = None
    network_reachable: bool | None = None
    network_probe: str | None = None
    network_probed: list[str] | None = None  # the endpoints the probe tried (HOST:PORT); None: not recorded
    network_probe_remembered: bool = False  # the host's answer of less than a minute ago, not a probe of this run
    needs_network: bool = False
    verdict_untrusted: bool = False
    apply_log_sha256: str = ""
    test_log_sha256: str = ""
    patch_sha256: str | None = None  # the patch this verdict belongs to: a resume re-evaluates any other
    apply_stderr_log_sha256: str = ""
    test_stderr_log_sha256: str = ""


class ReduceResult(PhaseResult):
    phase = Phase.REDUCE
    resolved: bool = False
    terminal_state: TerminalState = TerminalState.RUNNER_FAILED
    first_failed_phase: Phase | None = None
    failure_label: str = ""


RESULTS: dict[Phase, type[PhaseResult]] = {
    result.phase: result
    for result in (PrepareResult, PrecheckResult, ExtractResult, BaselineResult, CodexResult, PatchResult,
                   EvaluateResult, ReduceResult)
}

R = TypeVar("R", bound=PhaseResult)


class Marker(BaseModel, Generic[R]):
    """One phase's record: its status and timing, and its typed result under ``details``.

    Written only by the runner, public-safe by construction. Build one with
    ``marker_type(phase)``: the bare class knows no phase's fields.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    phase: Phase
    status: MarkerStatus
    started_at: str
    ended_at: str
    duration_seconds: float = Field(ge=0)
    exit_code: int | None = None
    reason: Reason
    details: R

    @model_validator(mode="before")
    @classmethod
    def _outcome_into_details(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("details"), dict):
            outcome = {"reason": data.get("reason", Reason.OK), "exit_code": data.get("exit_code")}
            data = {**data, "details": {**data["details"], **outcome}}
        return data

    @model_validator(mode="after")
    def _details_agree(self) -> Marker[R]:
        if self.details.phase is not self.phase:
            raise ValueError(f"details of {self.details.phase.value} in a {self.phase.value} marker")
        if (self.details.reason, self.details.exit_code) != (self.reason, self.exit_code):
            raise ValueError("details disagree with the marker's reason or exit code")
        return self

    @property
    def ok(self) -> bool:
        return self.status is MarkerStatus.OK


# Each phase's marker model, made once and held: pydantic keeps a parametrized generic only
# weakly, so ``Marker[...]`` asked for afresh rebuilt the whole model class, again and again
# (about 10 ms of every task's CPU). Made when first asked for, not at import (every command
# imports this module); a fork server makes them all before it forks.
_MARKER_TYPES: dict[Phase, type[Marker[Any]]] = {}


def marker_type(phase: Phase) -> type[Marker[Any]]:
    """The marker model whose ``details`` is ``phase``'s result."""
    model = _MARKER_TYPES.get(phase)
    if model is None:
        model = _MARKER_TYPES[phase] = Marker[RESULTS[phase]]  # type: ignore[valid-type]
    return model
