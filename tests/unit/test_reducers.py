"""Markers to compact outputs: verdicts, labels, determinism, and bad input named by file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reducers.compact import reduce_markers, reduce_real_result
from reducers.guard import check_public
from reducers.markers import read_markers
from reducers.models import Marker, MarkerStatus, Phase, marker_type
from runner.errors import CompactInputError, PublicSafetyError
from runner.journal import write_marker
from runner.phases.reduce import reduce_job
from runner.jobroot import JobRoot

IMAGE_ID = "sha256:" + "1" * 64


def _marker(phase: Phase, ok: bool = True, reason: str = "ok", exit_code: int | None = None, **details) -> Marker:
    return marker_type(phase)(
        phase=phase,
        status=MarkerStatus.OK if ok else MarkerStatus.FAILED,
        started_at="2026-01-01T00:00:00.000+00:00",
        ended_at="2026-01-01T00:00:01.000+00:00",
        duration_seconds=1.0,
        exit_code=exit_code,
        reason=reason,
        details=details,
    )


def _run_until(last: Phase | None = None, **evaluate) -> dict[Phase, Marker]:
    markers = {
        Phase.PREPARE: _marker(Phase.PREPARE, tag="lagent_239", image="alfin06/agentissue-bench:lagent_239"),
        Phase.PRECHECK: _marker(Phase.PRECHECK, codex_version="codex-cli 0.171.0", image_id=IMAGE_ID),
        Phase.EXTRACT: _marker(Phase.EXTRACT, image_id=IMAGE_ID, image_digest=None, oracle_entries_extracted=0),
        Phase.BASELINE: _marker(Phase.BASELINE, baseline_commit="a" * 40),
        Phase.CODEX: _marker(Phase.CODEX, exit_code=0, stdout_sha256="c" * 64, stderr_sha256="d" * 64),
        Phase.PATCH: _marker(
            Phase.PATCH, patch_sha256="e" * 64, patch_bytes=680, changed_file_count=2, added_file_count=1, hunk_count=2
        ),
    }
    fields = {"image_id": IMAGE_ID, "apply_exit_code": 0, "test_exit_code": 0, "timed_out": False,
              "resolved": True, "string_verdict": True, "verdicts_disagree": False,
              "apply_log_sha256": "f" * 64, "test_log_sha256": "0" * 64, "network": "bridge"}
    fields.update(evaluate)
    markers[Phase.EVALUATE] = _marker(Phase.EVALUATE, exit_code=fields["test_exit_code"], **fields)
    if last is not None:
        order = list(markers)
        markers = {p: m for p, m in markers.items() if order.index(p) <= order.index(last)}
    return markers


def test_resolved_run() -> None:
    run, result = reduce_markers(_run_until())
    assert run["official_task_score"] == {"kind": "agentissue_bench_single_tag_container_eval", "value": 1, "resolved": True}
    assert run["failure_attribution_labels"] == ["resolved_single_tag_eval"]
    assert result["terminal_state"] == "resolved"
    assert run["validation"]["selected_image_only"] is True
    assert run["validation"]["fixed_source_not_extracted_to_host"] is True
    assert run["log_sha256"]["eval_test"] == "0" * 64
    assert run["codex"]["version"] == "codex-cli 0.171.0"


@pytest.mark.parametrize(
    ("evaluate", "label"),
    [
        ({"test_exit_code": 1, "resolved": False, "string_verdict": False}, "unresolved_single_tag_eval_compact_result"),
        ({"apply_exit_code": 1, "test_exit_code": None, "resolved": False, "string_verdict": False},
         "unresolved_patch_apply_failed_compact_result"),
        ({"test_exit_code": None, "timed_out": True, "resolved": False, "string_verdict": False}, "unresolved_eval_timeout"),
    ],
)
def test_unresolved_runs_get_their_labels(evaluate: dict, label: str) -> None:
    run, result = reduce_markers(_run_until(**evaluate))
    assert run["official_task_score"]["resolved"] is False
    assert run["failure_attribution_labels"] == [label]
    assert result["terminal_state"] == "evaluated_unresolved"


def test_the_string_verdict_never_decides_resolved() -> None:
    run, _ = reduce_markers(_run_until(test_exit_code=1, resolved=False, string_verdict=True, verdicts_disagree=True))
    assert run["official_task_score"]["resolved"] is False
    assert run["evaluation"]["string_verdict"] is True and run["evaluation"]["verdicts_disagree"] is True


def test_a_failed_phase_is_named_first() -> None:
    markers = _run_until(Phase.CODEX)
    markers[Phase.PATCH] = _marker(Phase.PATCH, ok=False, reason="empty_patch")
    run, result = reduce_markers(markers)
    assert run["first_failed_phase"] == "patch" and run["first_failure_reason"] == "empty_patch"
    assert run["failure_attribution_labels"] == ["failed_patch_empty_patch"]
    assert result["terminal_state"] == "runner_failed"
    assert run["evaluation"]["ran"] is False and run["patch_sha256"] == "missing"


def test_outputs_are_deterministic_and_public_safe() -> None:
    first = reduce_markers(_run_until())
    assert first == reduce_markers(_run_until())
    real = reduce_real_result(*first)
    assert real["result_summary"]["official_task_score"]["passed"] is True
    for name, doc in zip(("run", "result", "real"), (*first, real)):
        check_public(name, doc)


def test_real_result_refuses_mismatched_compact_files() -> None:
    run, result = reduce_markers(_run_until())
    result["selected_tag"] = "other_1"
    with pytest.raises(CompactInputError, match="benchmark_result.compact.json: selected_tag"):
        reduce_real_result(run, result)


def test_real_result_names_a_hand_edited_field() -> None:
    run, result = reduce_markers(_run_until())
    run["patch_bytes"] = "many"
    with pytest.raises(CompactInputError) as caught:
        reduce_real_result(run, result)
    assert caught.value.file == "benchmark_run.compact.json" and caught.value.field == "patch_bytes"


def test_reduce_without_prepare_marker_is_refused() -> None:
    with pytest.raises(CompactInputError, match="prepare.json"):
        reduce_markers({})


def test_corrupt_marker_names_file_and_field(tmp_path: Path) -> None:
    markers_dir = tmp_path / "result-markers"
    write_marker(markers_dir, _marker(Phase.PREPARE, tag="t", image="i"))
    raw = json.loads((markers_dir / "prepare.json").read_text())
    raw["duration_seconds"] = -5
    (markers_dir / "prepare.json").write_text(json.dumps(raw))
    with pytest.raises(CompactInputError) as caught:
        read_markers(markers_dir)
    assert caught.value.file == "result-markers/prepare.json" and caught.value.field == "duration_seconds"
    (markers_dir / "prepare.json").write_text("{not json")
    with pytest.raises(CompactInputError, match="prepare.json: <root>: not readable JSON"):
        read_markers(markers_dir)


def test_a_marker_under_the_wrong_name_is_refused(tmp_path: Path) -> None:
    markers_dir = tmp_path / "result-markers"
    write_marker(markers_dir, _marker(Phase.CODEX))
    (markers_dir / "codex.json").rename(markers_dir / "patch.json")
    with pytest.raises(CompactInputError, match="patch.json: phase"):
        read_markers(markers_dir)


def test_reduce_job_writes_the_three_files_and_nothing_on_guard_failure(tmp_path: Path) -> None:
    job = JobRoot.at(tmp_path / "job", "lagent_239")
    for marker in _run_until().values():
        write_marker(job.markers, marker)
    result = reduce_job(job)
    assert result.resolved is True
    names = sorted(p.name for p in job.root.glob("*.json"))
    assert names == ["benchmark_result.compact.json", "benchmark_run.compact.json", "real-result.public.json"]
    # A marker detail carrying a host path must stop the reduce before anything is written.
    for path in job.root.glob("*.json"):
        path.unlink()
    write_marker(job.markers, _marker(Phase.PREPARE, tag="lagent_239", image=f"{job.root}/evil"))
    with pytest.raises(PublicSafetyError, match="refused by the public guard"):
        reduce_job(job)
    assert list(job.root.glob("*.json")) == []
