"""Batch pieces without Docker: the tags file, the ledger, rows from compact files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reducers.compact import BenchmarkRun
from runner.batch import Unit, _row
from runner.errors import BadInputError, CompactInputError, PublicSafetyError
from runner.ledger import LedgerRow, RunLedger
from runner.tags import read_tags_file, unique_tags
from runner.tasks.protocol import TaskOutcome, TaskRequest
from runner.tasks.spec import read_operator, resolve
from runner.tasks.protocol import task_environment
from runner.tasks.supervisor import TaskEnd


def test_tags_file_comments_and_blanks(tmp_path: Path) -> None:
    path = tmp_path / "tags.txt"
    path.write_text("# AgentIssue-Bench\nlagent_239\n\n  crewai_2127   # later\nlagent_239\n")
    assert unique_tags(read_tags_file(path)) == ["lagent_239", "crewai_2127"]


def test_a_bad_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "tags.txt"
    path.write_text("ok_1\nnot ok; rm\n")
    with pytest.raises(BadInputError, match="line 2"):
        read_tags_file(path)
    with pytest.raises(BadInputError, match="--tags-file"):
        read_tags_file(tmp_path / "absent.txt")
    with pytest.raises(BadInputError, match="no tags"):
        unique_tags([])


def test_a_task_request_carries_every_setting_and_survives_json(tmp_path: Path) -> None:
    operator = read_operator({"codex_bin": "/opt/codex", "eval_timeout": 9, "allow_pull": True, "cache_max_gb": 0,
                              "image": "stub:1"}, environ={})
    request = TaskRequest(spec=operator.spec.for_tag("t_1"), job_root=tmp_path / "t_1", attempt=2, host=operator.host)
    again = TaskRequest.model_validate_json(request.model_dump_json())
    assert again == request
    task = resolve(again.spec, again.host, job_root=again.job_root)
    assert (task.tag, task.image, task.codex_bin, task.eval_timeout, task.allow_pull, task.cache_max_gb) == (
        "t_1", "stub:1", "/opt/codex", 9.0, True, 0.0)
    assert task.job_root == tmp_path / "t_1"
    assert read_operator({}, environ={}).spec.for_tag("t_1").image is None  # each tag gets its own image


def test_a_tasks_own_variables_never_reach_another_task() -> None:
    env = task_environment({"IMAGE": "one:image", "TAG": "x", "JOB_ROOT": "/j", "PATH": "/bin", "CODEX_BIN": "c"})
    assert env == {"PATH": "/bin", "CODEX_BIN": "c"}


@pytest.mark.parametrize("tag", [".", "-x", "..", "a:b", ".hidden"])
def test_tags_that_are_not_docker_tags_are_refused(tmp_path: Path, tag: str) -> None:
    path = tmp_path / "tags.txt"
    path.write_text(f"{tag}\n")
    with pytest.raises(BadInputError, match="line 1"):
        read_tags_file(path)


def _row_for(tag: str, **overrides) -> LedgerRow:
    fields = dict(tag=tag, state="done", exit_code=0, resolved=True, first_failed_phase=None,
                  failure_label="resolved_single_tag_eval", wall_seconds=1.5, phase_durations_seconds={"codex": 1.0},
                  patch_sha256="a" * 64, patch_bytes=10, image_digest=None, image_id="sha256:" + "b" * 64,
                  input_tokens=5, output_tokens=2)
    fields.update(overrides)
    return LedgerRow(**fields)


def test_the_ledger_upserts_atomically_and_renders_markdown(tmp_path: Path) -> None:
    ledger = RunLedger(tmp_path, private_texts=[str(tmp_path)])
    ledger.upsert(_row_for("b_2"))
    ledger.upsert(_row_for("a_1", state="failed", exit_code=1, resolved=False, first_failed_phase="codex"))
    ledger.upsert(_row_for("b_2", wall_seconds=3.0))
    document = json.loads((tmp_path / "run-ledger.json").read_text())
    assert document["schema_version"] == "benchmark_run_ledger_v1"
    assert [row["tag"] for row in document["rows"]] == ["a_1", "b_2"]
    assert document["rows"][1]["wall_seconds"] == 3.0
    markdown = (tmp_path / "run-ledger.md").read_text()
    assert "| a_1 | failed | no | codex |" in markdown and "| b_2 | done | yes | - | 3.0 |" in markdown
    assert not list(tmp_path.glob("*.tmp"))
    assert RunLedger(tmp_path, private_texts=[]).rows["a_1"].state == "failed"


def test_the_ledger_passes_the_guard(tmp_path: Path) -> None:
    ledger = RunLedger(tmp_path, private_texts=[str(tmp_path)])
    with pytest.raises(PublicSafetyError):
        ledger.upsert(_row_for("x_1", failure_label=f"{tmp_path}/leak"))
    assert not (tmp_path / "run-ledger.json").exists()


def test_a_corrupt_ledger_is_named(tmp_path: Path) -> None:
    (tmp_path / "run-ledger.json").write_text('{"rows": [{"tag": 1}]}')
    with pytest.raises(CompactInputError, match="run-ledger.json"):
        RunLedger(tmp_path, private_texts=[])


def test_rows_from_compact_files_and_from_nothing(tmp_path: Path) -> None:
    job = tmp_path / "t_1"
    job.mkdir()
    refused = _row(Unit("t_1", None, job), TaskEnd(returncode=2, outcome=None), 0.5)
    assert (refused.state, refused.resolved, refused.input_tokens, refused.failure_label) == ("failed", None, 0, "bad_input")
    assert refused.infra_failure is False and not refused.scored  # the operator's input, not the host's failure
    golden = Path(__file__).resolve().parents[1] / "golden" / "failed" / "benchmark_run.compact.json"
    run = BenchmarkRun.model_validate_json(golden.read_bytes())
    row = _row(Unit("t_1", None, job), TaskEnd(returncode=1, outcome=TaskOutcome(exit_code=1, run=run)), 4.0)
    # codex failing is the agent's failure: scored, unresolved
    assert (row.state, row.resolved, row.failure_label, row.patch_sha256, row.scored) == (
        "done", False, "failed_codex_codex_exit_nonzero", None, True)
    assert (row.input_tokens, row.phase_durations_seconds) == (run.metrics.input_tokens, run.phase_durations_seconds)


def test_a_v0_ledger_is_read_and_upgraded(tmp_path: Path) -> None:
    v0 = {"tag": "x_1", "exit_code": 1, "resolved": False, "first_failed_phase": "extract", "wall_seconds": 1.0,
          "phase_durations_seconds": {}, "patch_sha256": None, "patch_bytes": None, "image_digest": None,
          "image_id": None, "input_tokens": 0, "output_tokens": 0}
    rows = [{**v0, "state": "failed", "failure_label": "failed_extract_unsafe_archive_entry"},
            {**v0, "tag": "x_2", "state": "failed", "failure_label": "failed_codex_codex_timeout"},
            {**v0, "tag": "x_3", "state": "completed", "exit_code": 0, "failure_label": "resolved_single_tag_eval",
             "resolved": True}]
    (tmp_path / "run-ledger.json").write_text(json.dumps({"schema_version": "benchmark_run_ledger_v0", "rows": rows}))
    read = RunLedger(tmp_path, private_texts=[]).rows
    assert (read["x_1"].state, read["x_1"].infra_failure) == ("failed", True)
    assert (read["x_2"].state, read["x_2"].scored) == ("done", True)
    assert (read["x_3"].state, read["x_3"].evaluated) == ("done", True)
