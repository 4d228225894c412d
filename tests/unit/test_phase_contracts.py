"""The typed contract of each phase: what it returns is what its marker stores and what is read back."""

from __future__ import annotations

import ast
import json
import typing
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from reducers.errors import CompactInputError
from reducers.markers import read_marker
from reducers.models import (
    RESULTS,
    CodexResult,
    EvaluateResult,
    Phase,
    PhaseResult,
    Reason,
    marker_type,
)
from runner.errors import PhaseError
from runner.journal import PhaseClock, load_marker, write_marker
from runner.phases.precheck import CHECK_NAMES
from runner.pipeline import STEPS, phase_failure
from runner.phases import agent, baseline, evaluate, extract, patch, precheck, prepare, reduce

REPO = Path(__file__).resolve().parents[2]


def _reasons_in_code() -> set[str]:
    """Every reason literal the runner can put in a marker: error classes' ``reason``, the
    ``reason=`` of an error raised, PhaseError's and PhaseFailure's reason argument."""
    found: set[str] = set()
    for path in (REPO / "runner").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if (isinstance(item, ast.Assign) and any(getattr(t, "id", None) == "reason" for t in item.targets)
                            and isinstance(item.value, ast.Constant)):
                        found.add(item.value.value)
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", "")
            if name == "PhaseError" and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                found.add(node.args[1].value)
            if name == "PhaseFailure" and node.args and isinstance(node.args[0], ast.Constant):
                found.add(node.args[0].value)
            if name.endswith("Error"):
                for keyword in node.keywords:
                    if keyword.arg == "reason" and isinstance(keyword.value, ast.Constant):
                        found.add(keyword.value.value)
    return found


def test_every_reason_the_runner_can_record_is_in_the_enum() -> None:
    in_code = _reasons_in_code() | {f"precheck_{name}" for name in CHECK_NAMES}
    assert {"empty_source", "empty_patch", "docker_error", "interrupted", "precheck_tag_scorable"} <= in_code
    unknown = sorted(in_code - {reason.value for reason in Reason})
    assert not unknown, f"reasons the code records that reducers.models.Reason lacks: {unknown}"


@pytest.mark.parametrize(
    ("phase", "entry"),
    [(Phase.PREPARE, prepare.prepare), (Phase.PRECHECK, precheck.precheck), (Phase.EXTRACT, extract.extract),
     (Phase.BASELINE, baseline.baseline), (Phase.CODEX, agent.agent), (Phase.PATCH, patch.export_patch),
     (Phase.EVALUATE, evaluate.evaluate), (Phase.REDUCE, reduce.reduce_job)],
)
def test_each_phase_returns_its_contract(phase: Phase, entry: typing.Callable) -> None:
    returned = typing.get_type_hints(entry)["return"]
    assert returned is RESULTS[phase] and returned.phase is phase
    assert returned.model_config["frozen"] and returned.model_config["extra"] == "forbid"
    assert phase is Phase.REDUCE or phase in STEPS


def test_a_marker_stores_the_result_and_reads_it_back_typed(tmp_path: Path) -> None:
    result = EvaluateResult(reason=Reason.EVAL_TIMEOUT, exit_code=124, apply_exit_code=0, timed_out=True,
                            network="none", patch_sha256="e" * 64)
    write_marker(tmp_path, PhaseClock(Phase.EVALUATE).marker(result))
    on_disk = json.loads((tmp_path / "evaluate.json").read_text())
    assert on_disk["reason"] == "eval_timeout" and on_disk["exit_code"] == 124
    assert "reason" not in on_disk["details"] and "exit_code" not in on_disk["details"]
    back = load_marker(tmp_path, Phase.EVALUATE)
    assert isinstance(back.details, EvaluateResult)
    assert back.details == result and back.details.timed_out is True and back.details.string_verdict is None


def test_a_detail_the_phase_does_not_record_is_refused_by_file_and_field(tmp_path: Path) -> None:
    write_marker(tmp_path, PhaseClock(Phase.CODEX).marker(CodexResult(turns=2)))
    raw = json.loads((tmp_path / "codex.json").read_text())
    raw["details"]["resolved"] = True  # an evaluate field smuggled into codex's marker
    (tmp_path / "codex.json").write_text(json.dumps(raw))
    with pytest.raises(CompactInputError) as caught:
        read_marker(tmp_path / "codex.json", expected_phase=Phase.CODEX)
    assert caught.value.field == "details.resolved"


def test_details_cannot_lie_about_the_phase_or_its_reason() -> None:
    with pytest.raises(ValueError, match="instance of EvaluateResult"):
        marker_type(Phase.EVALUATE)(phase=Phase.EVALUATE, status="ok", started_at="a", ended_at="b",
                                    duration_seconds=0, reason="ok", details=CodexResult())
    with pytest.raises(ValueError, match="disagree"):
        marker_type(Phase.CODEX)(phase=Phase.CODEX, status="failed", started_at="a", ended_at="b",
                                 duration_seconds=0, reason="codex_timeout", details=CodexResult())


def test_a_failure_keeps_its_typed_details() -> None:
    error = PhaseError("codex", "codex_wrote_runner_files", "it wrote the runner's files", exit_code=0,
                       details={"runner_files_touched": 2, "timed_out": False})
    result = phase_failure(Phase.CODEX, error).result(Phase.CODEX)
    assert isinstance(result, CodexResult)
    assert (result.reason, result.exit_code, result.runner_files_touched) == (Reason.CODEX_WROTE_RUNNER_FILES, 0, 2)


def test_a_failure_outside_the_schema_is_recorded_as_the_runners_bug() -> None:
    error = PhaseError("patch", "empty_patch", "nothing", details={"not_a_patch_field": 1})
    with capture_logs() as logs:
        result = phase_failure(Phase.PATCH, error).result(Phase.PATCH)
    assert (result.reason, result.error_type) == (Reason.INTERNAL_ERROR, "PhaseError")
    assert [entry["event"] for entry in logs] == ["failure_outside_the_schema"]
    assert logs[0]["fields"] == ["not_a_patch_field"] and logs[0]["log_level"] == "error"


def test_the_base_result_knows_no_phase_fields() -> None:
    assert set(PhaseResult.model_fields) == {"reason", "exit_code", "error_type"}
    for phase, contract in RESULTS.items():
        assert contract.phase is phase and issubclass(contract, PhaseResult)
