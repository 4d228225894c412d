"""Batch pieces without Docker: the tags file, the ledger, rows from compact files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.batch import Unit, _row, child_argv, child_environment
from runner.tags import read_tags_file, unique_tags
from runner.errors import BadInputError, CompactInputError, PublicSafetyError
from runner.ledger import LedgerRow, RunLedger
from runner.settings import load_settings


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


def test_child_argv_passes_every_setting_as_a_flag(tmp_path: Path) -> None:
    settings = load_settings(codex_bin="/opt/codex", eval_timeout=9, allow_pull=True)
    argv = child_argv(settings, "t_1", tmp_path / "t_1", "stub:1")
    assert argv[1:4] == ["-m", "runner", "--execute"]
    flags = dict(arg.split("=", 1) for arg in argv[4:] if "=" in arg)
    assert flags["--tag"] == "t_1" and flags["--image"] == "stub:1" and flags["--codex-bin"] == "/opt/codex"
    assert flags["--eval-timeout"] == "9.0" and "--allow-pull" in argv
    assert not any(arg.startswith("--image") for arg in child_argv(settings, "t_1", tmp_path, None))


def test_a_tasks_own_variables_never_reach_another_task() -> None:
    env = child_environment({"IMAGE": "one:image", "TAG": "x", "JOB_ROOT": "/j", "PATH": "/bin", "CODEX_BIN": "c"})
    assert env == {"PATH": "/bin", "CODEX_BIN": "c"}


@pytest.mark.parametrize("tag", [".", "-x", "..", "a:b", ".hidden"])
def test_tags_that_are_not_docker_tags_are_refused(tmp_path: Path, tag: str) -> None:
    path = tmp_path / "tags.txt"
    path.write_text(f"{tag}\n")
    with pytest.raises(BadInputError, match="line 1"):
        read_tags_file(path)


def _row_for(tag: str, **overrides) -> LedgerRow:
    fields = dict(tag=tag, state="completed", exit_code=0, resolved=True, first_failed_phase=None,
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
    assert document["schema_version"] == "benchmark_run_ledger_v0"
    assert [row["tag"] for row in document["rows"]] == ["a_1", "b_2"]
    assert document["rows"][1]["wall_seconds"] == 3.0
    markdown = (tmp_path / "run-ledger.md").read_text()
    assert "| a_1 | failed | no | codex |" in markdown and "| b_2 | completed | yes | - | 3.0 |" in markdown
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
    assert _row(Unit("t_1", None, job), 2, 0.5).state == "bad_input"
    (job / "benchmark_run.compact.json").write_text(json.dumps({
        "official_task_score": {"resolved": False}, "first_failed_phase": "patch",
        "failure_attribution_labels": ["failed_patch_empty_patch"], "phase_durations_seconds": {"codex": 2.0},
        "patch_bytes": 0, "patch_sha256": "missing", "metrics": {"input_tokens": 3, "output_tokens": 1},
    }))
    row = _row(Unit("t_1", None, job), 1, 4.0)
    assert (row.state, row.resolved, row.failure_label, row.patch_sha256) == ("failed", False, "failed_patch_empty_patch", None)
