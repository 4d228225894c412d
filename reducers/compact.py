"""Markers to the compact public results, with the reference's schema and field names.

Pure and deterministic: the same markers give byte-identical outputs, so
``--reduce`` reproduces what ``--execute`` wrote. Two stages, as in the reference:
markers -> ``benchmark_run_v0`` + ``benchmark_result_v0``; those two compact
documents -> ``real-result.public.json``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from reducers.markers import compact_input_error
from reducers.models import (
    Frozen,
    RESULTS,
    CodexResult,
    EvaluateResult,
    ExtractResult,
    Marker,
    PatchResult,
    Phase,
    PrecheckResult,
    PrepareResult,
    Reason,
    TerminalState,
)
from reducers.errors import CompactInputError

BENCHMARK_ID = "agentissue-bench"
SOURCE_RUNNER = "agentissue_runner"
REAL_RESULT_SCHEMA = "agentissue_bench_codex_cli_runner_real_result_reducer_v0"
SCORE_KIND = "agentissue_bench_single_tag_container_eval"
TRACE_PUBLICNESS = "compact_public_no_issue_text_no_patch_no_logs"
EVIDENCE_FILES = ["real-result.public.json", "benchmark_run.compact.json", "benchmark_result.compact.json"]

LABEL_RESOLVED = "resolved_single_tag_eval"
LABEL_APPLY_FAILED = "unresolved_patch_apply_failed_compact_result"
LABEL_UNRESOLVED = "unresolved_single_tag_eval_compact_result"
LABEL_EVAL_TIMEOUT = "unresolved_eval_timeout"
LABEL_INCOMPLETE = "incomplete_run_no_failed_phase"

# Phases whose durations are reported; reduce itself is excluded so reruns are identical.
TIMED_PHASES = tuple(p for p in Phase if p is not Phase.REDUCE)



class OfficialScore(Frozen):
    kind: str = SCORE_KIND
    value: int
    resolved: bool


class Progress(Frozen):
    n_total_trials: int = 1
    n_completed_trials: int
    n_errored_trials: int
    n_running_trials: int = 0
    n_pending_trials: int
    n_cancelled_trials: int = 0
    n_retries: int = 0


class Metrics(Frozen):
    input_tokens: int = 0
    cache_tokens: int = 0
    output_tokens: int = 0
    # On the rate card whose sha256 is beside it; None (cost_known false): the card lacks the model.
    cost_usd: float | None = 0
    # beside the reference's names: codex's newer usage fields, summed over every turn
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    cost_known: bool = True
    rate_card_sha256: str | None = None


class Trial(Frozen):
    task_id: str
    trial_name: str
    source: str = "selected_public_tag"
    exception_type: str
    trajectory_present: bool = False
    artifact_manifest_present: bool = False
    trial_result_present: bool


class Validation(Frozen):
    selected_image_only: bool
    single_tag_only: bool = True
    buggy_source_extracted: bool
    fixed_source_not_extracted_to_host: bool
    host_codex_cli_invoked: bool
    patch_exported_from_buggy_source_git_diff: bool
    patch_applied_in_container: bool
    patched_eval_exit_zero: bool
    patched_eval_success_marker: bool
    verdict_from_exit_codes: bool = False  # the headline is the official rule (exit code and stdout strings)
    verdict_from_official_rule: bool = True
    no_upload: bool = True
    no_submit: bool = True
    no_public_ranking_path: bool = True
    raw_logs_public: bool = False
    patch_content_public: bool = False
    credential_values_recorded: bool = False
    codex_auth_synced_to_container_or_remote: bool = False


class Evaluation(Frozen):
    ran: bool
    apply_exit_code: int | None
    test_exit_code: int | None
    timed_out: bool
    exit_code_verdict: bool
    string_verdict: bool | None
    verdicts_disagree: bool
    network: str | None
    # The official score is official_task_score; these say how far to trust it.
    network_reachable: bool | None = None
    network_probe: str | None = None
    network_probed: list[str] | None = None  # which endpoints the probe tried (--eval-probe, else the index)
    network_probe_remembered: bool = False  # the answer was the host's of less than a minute ago
    needs_network: bool = False
    verdict_untrusted: bool = False
    apply_seconds: float | None = None
    test_seconds: float | None = None


class Scorability(Frozen):
    """What the tag's profile and the image's layout said before any codex token was spent."""

    tag_profile: str | None
    refusal: str | None
    unscorable_override: bool


class Codex(Frozen):
    invoked: bool
    version: str | None
    exit_code: int | None
    timed_out: bool
    last_message_present: bool
    model: str | None = None
    overrides_sha256: str | None = None
    turns: int = 0
    failed_turns: int = 0
    model_error: str | None = None
    # A live cap (--max-tokens, --max-cost-usd) stopped codex; the attempt was still scored.
    budget_exceeded: bool = False
    budget_reason: str | None = None


class BenchmarkRun(Frozen):
    schema_version: str = "benchmark_run_v0"
    source_runner: str = SOURCE_RUNNER
    benchmark_id: str = BENCHMARK_ID
    job_name: str
    selected_tag: str
    selected_image: str
    image_id: str | None
    image_digest: str | None
    trace_publicness: str = TRACE_PUBLICNESS
    real_run: bool = True
    no_upload: bool = True
    no_submit: bool = True
    no_public_ranking_path: bool = True
    submit_eligible: bool = False
    leaderboard_evidence: bool = False
    official_score_claim_allowed: bool = False
    first_failed_phase: str | None
    first_failure_reason: str | None
    score_failure_attribution: str
    failure_attribution_labels: list[str]
    patch_sha256: str
    patch_bytes: int
    changed_file_count: int
    added_file_count: int
    hunk_count: int
    binary_change_count: int
    sensitive_file_count: int
    artifact_files_left_out: int = 0
    infra_failure: bool = False
    source_from_cache: bool = False  # buggy-source/ was checked out of the host's extraction cache
    patched_exit_code: int | None
    apply_exit_code: int | None
    official_task_score: OfficialScore
    verdict_untrusted: bool = False
    scorability: Scorability | None = None
    evaluation: Evaluation
    codex: Codex
    # Which agent made the attempt, and its version (runner.agents); left out for a marker of
    # before the agent seam (codex), so the public files of such runs stay byte for byte the same.
    agent: str | None = None
    agent_version: str | None = None
    phase_status: dict[str, str]
    phase_durations_seconds: dict[str, float]
    log_sha256: dict[str, str]
    progress: Progress
    metrics: Metrics
    trials: list[Trial]
    validation: Validation
    evidence_files: list[str] = EVIDENCE_FILES


class BenchmarkResult(Frozen):
    schema_version: str = "benchmark_result_v0"
    benchmark_id: str = BENCHMARK_ID
    task_id: str
    selected_tag: str
    terminal_state: TerminalState
    trace_publicness: str = TRACE_PUBLICNESS
    official_task_score: OfficialScore
    first_failed_phase: str | None
    failure_attribution_labels: list[str]
    no_upload: bool = True
    no_submit: bool = True
    no_public_ranking_path: bool = True
    patch_sha256: str
    patch_bytes: int
    changed_file_count: int
    forbidden_access_count: int = 0
    infra_failure: bool = False


def _result(markers: dict[Phase, Marker], phase: Phase) -> Any:
    """``phase``'s recorded result; its schema's defaults when the phase never ran."""
    marker = markers.get(phase)
    return marker.details if marker is not None else RESULTS[phase]()


def _ok(markers: dict[Phase, Marker], phase: Phase) -> bool:
    marker = markers.get(phase)
    return bool(marker and marker.ok)


def _first_failure(markers: dict[Phase, Marker]) -> Marker | None:
    for phase in TIMED_PHASES:
        marker = markers.get(phase)
        if marker is not None and not marker.ok:
            return marker
    return None


def _failure_label(markers: dict[Phase, Marker], resolved: bool) -> str:
    failed = _first_failure(markers)
    if failed is not None:
        return f"failed_{failed.phase.value}_{failed.reason.value}"
    if resolved:
        return LABEL_RESOLVED
    if not _ok(markers, Phase.EVALUATE):
        return LABEL_INCOMPLETE
    evaluation: EvaluateResult = _result(markers, Phase.EVALUATE)
    if evaluation.timed_out:
        return LABEL_EVAL_TIMEOUT
    if evaluation.apply_exit_code != 0:
        return LABEL_APPLY_FAILED
    return LABEL_UNRESOLVED


def _infra_failure(markers: dict[Phase, Marker]) -> bool:
    """The model provider failed (error, broken or idle stream, missing key): not the agent's doing."""
    marker = markers.get(Phase.CODEX)
    return bool(marker and not marker.ok and marker.reason is Reason.CODEX_MODEL_ERROR)


def reduce_markers(markers: dict[Phase, Marker]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Markers to (benchmark_run_v0, benchmark_result_v0) documents.

    Raises:
        CompactInputError: the prepare marker (which records tag and image) is missing.
    """
    if Phase.PREPARE not in markers:
        raise CompactInputError("result-markers/prepare.json", "", "missing: the job root was never prepared")
    prepared: PrepareResult = _result(markers, Phase.PREPARE)
    prechecked: PrecheckResult = _result(markers, Phase.PRECHECK)
    extracted: ExtractResult = _result(markers, Phase.EXTRACT)
    agent: CodexResult = _result(markers, Phase.CODEX)
    patch: PatchResult = _result(markers, Phase.PATCH)
    evaluation: EvaluateResult = _result(markers, Phase.EVALUATE)
    tag = prepared.tag
    evaluated = _ok(markers, Phase.EVALUATE)
    resolved = evaluated and evaluation.resolved
    untrusted = evaluated and evaluation.verdict_untrusted
    label = _failure_label(markers, resolved)
    failed = _first_failure(markers)
    score = OfficialScore(value=1 if resolved else 0, resolved=resolved)
    infra_failure = _infra_failure(markers)
    log_sha256 = {
        "codex_stdout": agent.stdout_sha256,
        "codex_stderr": agent.stderr_sha256,
        "eval_apply": evaluation.apply_log_sha256,
        "eval_test": evaluation.test_log_sha256,
        "eval_apply_stderr": evaluation.apply_stderr_log_sha256,
        "eval_test_stderr": evaluation.test_stderr_log_sha256,
    }

    run = BenchmarkRun(
        job_name=f"agentissue_{tag}_codex_cli_runner",
        selected_tag=tag,
        selected_image=prepared.image,
        image_id=extracted.image_id,
        image_digest=extracted.image_digest,
        first_failed_phase=failed.phase.value if failed else None,
        first_failure_reason=failed.reason.value if failed else None,
        score_failure_attribution=label,
        failure_attribution_labels=[label],
        patch_sha256=patch.patch_sha256 if patch.patch_sha256 is not None else "missing",
        patch_bytes=patch.patch_bytes,
        changed_file_count=patch.changed_file_count,
        added_file_count=patch.added_file_count,
        hunk_count=patch.hunk_count,
        binary_change_count=patch.binary_change_count,
        sensitive_file_count=patch.sensitive_file_count,
        artifact_files_left_out=patch.artifact_files_left_out,
        infra_failure=infra_failure,
        source_from_cache=extracted.from_cache,
        patched_exit_code=evaluation.test_exit_code,
        apply_exit_code=evaluation.apply_exit_code,
        official_task_score=score,
        verdict_untrusted=untrusted,
        scorability=Scorability(
            tag_profile=prechecked.tag_profile,
            refusal=prechecked.refusal,
            unscorable_override=prechecked.unscorable_override,
        ) if Phase.PRECHECK in markers else None,
        evaluation=Evaluation(
            ran=evaluated,
            apply_exit_code=evaluation.apply_exit_code,
            test_exit_code=evaluation.test_exit_code,
            timed_out=evaluation.timed_out,
            exit_code_verdict=evaluated and evaluation.exit_code_verdict,
            string_verdict=evaluation.string_verdict,
            verdicts_disagree=evaluation.verdicts_disagree,
            network=evaluation.network,
            network_reachable=evaluation.network_reachable,
            network_probe=evaluation.network_probe,
            network_probed=evaluation.network_probed,
            network_probe_remembered=evaluation.network_probe_remembered,
            needs_network=evaluation.needs_network,
            verdict_untrusted=untrusted,
            apply_seconds=evaluation.apply_seconds,
            test_seconds=evaluation.test_seconds,
        ),
        codex=Codex(
            invoked=Phase.CODEX in markers,
            version=prechecked.codex_version,
            exit_code=markers[Phase.CODEX].exit_code if Phase.CODEX in markers else None,
            timed_out=agent.timed_out,
            last_message_present=agent.last_message_present,
            model=agent.model or None,
            overrides_sha256=agent.codex_overrides_sha256 or None,
            turns=agent.turns,
            failed_turns=agent.failed_turns,
            model_error=agent.model_error or None,
            budget_exceeded=agent.budget_exceeded,
            budget_reason=agent.budget_reason,
        ),
        agent=agent.agent,
        agent_version=prechecked.agent_version or (prechecked.codex_version if agent.agent else None),
        phase_status={p.value: markers[p].status.value for p in TIMED_PHASES if p in markers},
        phase_durations_seconds={p.value: markers[p].duration_seconds for p in TIMED_PHASES if p in markers},
        log_sha256={name: digest for name, digest in log_sha256.items() if digest},
        progress=Progress(
            n_completed_trials=1 if evaluated else 0,
            n_errored_trials=0 if resolved else 1,
            n_pending_trials=0,
        ),
        metrics=Metrics(
            input_tokens=agent.input_tokens,
            cache_tokens=agent.cached_input_tokens,
            output_tokens=agent.output_tokens,
            cache_write_tokens=agent.cache_write_input_tokens,
            reasoning_tokens=agent.reasoning_output_tokens,
            # nothing was spent before codex ran; after, the cost its marker priced (None: unknown)
            cost_usd=agent.cost_usd if Phase.CODEX in markers else 0,
            cost_known=agent.cost_known or Phase.CODEX not in markers,
            rate_card_sha256=agent.rate_card_sha256 or None,
        ),
        trials=[
            Trial(
                task_id=tag,
                trial_name=tag,
                exception_type="" if resolved else label,
                trial_result_present=evaluated,
            )
        ],
        validation=Validation(
            selected_image_only=bool(extracted.image_id) and extracted.image_id == evaluation.image_id,
            buggy_source_extracted=_ok(markers, Phase.EXTRACT),
            fixed_source_not_extracted_to_host=_ok(markers, Phase.EXTRACT) and extracted.oracle_entries_extracted == 0,
            host_codex_cli_invoked=Phase.CODEX in markers,
            patch_exported_from_buggy_source_git_diff=_ok(markers, Phase.PATCH) and patch.patch_bytes > 0,
            patch_applied_in_container=evaluation.apply_exit_code == 0,
            patched_eval_exit_zero=evaluation.test_exit_code == 0,
            patched_eval_success_marker=evaluation.string_verdict is True,
        ),
    )
    result = BenchmarkResult(
        task_id=f"agentissue_bench_{tag}",
        selected_tag=tag,
        terminal_state=(
            TerminalState.RESOLVED if resolved
            else TerminalState.EVALUATED_UNRESOLVED if evaluated
            else TerminalState.RUNNER_FAILED
        ),
        official_task_score=score,
        first_failed_phase=run.first_failed_phase,
        failure_attribution_labels=[label],
        patch_sha256=run.patch_sha256,
        patch_bytes=run.patch_bytes,
        changed_file_count=run.changed_file_count,
        infra_failure=infra_failure,
    )
    unsaid = {name for name in ("agent", "agent_version") if getattr(run, name) is None}
    return run.model_dump(mode="json", exclude=unsaid), result.model_dump(mode="json")


def _read_back(document: str, model: type[BaseModel], payload: Any) -> Any:
    try:
        return model.model_validate(payload)
    except ValidationError as e:
        raise compact_input_error(document, e) from e


def reduce_real_result(run_doc: Any, result_doc: Any) -> dict[str, Any]:
    """The two compact documents to ``real-result.public.json``.

    Raises:
        CompactInputError: a compact document is malformed or the two disagree.
    """
    run = _read_back("benchmark_run.compact.json", BenchmarkRun, run_doc)
    result = _read_back("benchmark_result.compact.json", BenchmarkResult, result_doc)
    if run.selected_tag != result.selected_tag:
        raise CompactInputError("benchmark_result.compact.json", "selected_tag", "differs from benchmark_run")
    if run.official_task_score != result.official_task_score:
        raise CompactInputError(
            "benchmark_result.compact.json", "official_task_score", "differs from benchmark_run"
        )
    if run.patch_sha256 != result.patch_sha256:
        raise CompactInputError("benchmark_result.compact.json", "patch_sha256", "differs from benchmark_run")
    checks = run.validation
    return {
        "schema_version": REAL_RESULT_SCHEMA,
        "benchmark_id": BENCHMARK_ID,
        "selected_tag": run.selected_tag,
        "selected_image": run.selected_image,
        "image_digest": run.image_digest,
        "path_recorded": False,
        "real_run_done": True,
        "real_runner_invoked_by_reducer": False,
        "real_codex_invoked_by_reducer": False,
        "real_docker_invoked_by_reducer": False,
        "input_files": {
            "benchmark_run": {"relative_path": "benchmark_run.compact.json", "schema_version": run.schema_version, "read": True},
            "benchmark_result": {"relative_path": "benchmark_result.compact.json", "schema_version": result.schema_version, "read": True},
        },
        "result_summary": {
            "official_task_score": {
                "kind": run.official_task_score.kind,
                "value": run.official_task_score.value,
                "passed": run.official_task_score.resolved,
            },
            "resolved": run.official_task_score.resolved,
            "terminal_state": result.terminal_state,
            "first_failed_phase": run.first_failed_phase,
            "failure_attribution_labels": run.failure_attribution_labels,
            "patch_sha256": run.patch_sha256,
            "patch_bytes": run.patch_bytes,
            "changed_file_count": run.changed_file_count,
            "hunk_count": run.hunk_count,
            "binary_change_count": run.binary_change_count,
            "sensitive_file_count": run.sensitive_file_count,
            "artifact_files_left_out": run.artifact_files_left_out,
            "infra_failure": run.infra_failure,
            "patched_exit_code": run.patched_exit_code,
            "apply_exit_code": run.apply_exit_code,
            "baseline_exit_code": None,  # the buggy tree's own test is not run (it would show the oracle nothing new)
            "string_verdict": run.evaluation.string_verdict,
            "exit_code_verdict": run.evaluation.exit_code_verdict,
            "verdicts_disagree": run.evaluation.verdicts_disagree,
            "verdict_untrusted": run.verdict_untrusted,
            "phase_durations_seconds": run.phase_durations_seconds,
            "log_sha256": run.log_sha256,
        },
        "phase_checks": {
            "selected_image_only": checks.selected_image_only,
            "single_tag_only": checks.single_tag_only,
            "buggy_source_extracted": checks.buggy_source_extracted,
            "fixed_source_not_extracted_to_host": checks.fixed_source_not_extracted_to_host,
            "host_codex_cli_invoked": checks.host_codex_cli_invoked,
            "patch_exported_from_buggy_source_git_diff": checks.patch_exported_from_buggy_source_git_diff,
            "patch_applied_in_container": checks.patch_applied_in_container,
            "patched_eval_exit_zero": checks.patched_eval_exit_zero,
            "patched_eval_success_marker": checks.patched_eval_success_marker,
        },
        "boundary": {
            "no_upload": True,
            "no_submit": True,
            "no_public_ranking_path": True,
            "codex_auth_synced": False,
            "credential_values_recorded": False,
            "raw_logs_public": False,
            "patch_content_public": False,
            "absolute_paths_public": False,
        },
        "public_outputs": EVIDENCE_FILES,
    }
