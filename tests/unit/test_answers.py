"""Clear answers to bad settings and odd inputs (issue 11, "wrong or unclear answers")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.codex_usage import usage_from_events
from runner.errors import BadInputError
from runner.tasks.spec import load_settings
from tests.conftest import FAKE_CODEX, run_cli

NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent.sock"}


@pytest.mark.parametrize("value", ["inf", "1e300", "nan", "1e-9", "0.5", "-1"])
@pytest.mark.parametrize("flag", ["--eval-timeout", "--codex-timeout", "--extract-timeout"])
def test_deadlines_out_of_bounds_are_refused_naming_the_flag(tmp_path: Path, flag: str, value: str) -> None:
    job = tmp_path / "job"
    done = run_cli("--execute", "--job-root", str(job), flag, value, env=NO_DOCKER)
    assert done.returncode == 2, done.stderr
    assert f"{flag}:" in done.stderr and "Value error" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_bad_environment_variable_is_named_as_typed(tmp_path: Path) -> None:
    done = run_cli("--execute", "--job-root", str(tmp_path / "job"),
                   env={**NO_DOCKER, "RUNNER_EVAL_TIMEOUT": "abc", "CONTAINER_BUGGY_SOURCE": "relative"})
    assert done.returncode == 2
    assert "RUNNER_EVAL_TIMEOUT:" in done.stderr and "CONTAINER_BUGGY_SOURCE:" in done.stderr
    assert "eval_timeout" not in done.stderr and "Value error," not in done.stderr


def test_settings_errors_drop_pydantics_prefix() -> None:
    with pytest.raises(BadInputError) as caught:
        load_settings(source_dir="relative")
    assert str(caught.value).startswith("invalid settings: --source-dir: must be an absolute path")


def test_workers_zero_is_refused(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    done = run_cli("--execute", "--jobs-dir", str(tmp_path / "jobs"), "--tag", "t_1", "--workers", "0", env=NO_DOCKER)
    assert done.returncode == 2 and "--workers" in done.stderr
    assert list((tmp_path / "jobs").iterdir()) == []


def test_a_tags_file_line_with_dots_is_refused_naming_the_line(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    tags = tmp_path / "tags.txt"
    tags.write_text("good_1\n# comment\nx..y\n")
    done = run_cli("--execute", "--jobs-dir", str(tmp_path / "jobs"), "--tags-file", str(tags), env=NO_DOCKER)
    assert done.returncode == 2
    assert "--tags-file line 3" in done.stderr and "'x..y'" in done.stderr


def test_a_bad_image_variable_does_not_refuse_a_batch(tmp_path: Path) -> None:
    """The README: a batch ignores IMAGE (and TAG); only --image applies to every tag."""
    jobs = tmp_path / "jobs"
    (jobs / "t_1" / "context").mkdir(parents=True)
    (jobs / "t_1" / "context" / "prompt.md").write_text("fake-codex-mode: fix\n")
    done = run_cli("--execute", "--jobs-dir", str(jobs), "--tag", "t_1", "--codex-bin", str(FAKE_CODEX),
                   env={**NO_DOCKER, "IMAGE": "not an image $(id)", "TAG": "bad tag"})
    assert "invalid settings" not in done.stderr, done.stderr
    summary = json.loads(done.stdout)  # the batch ran; its task found no Docker (exit 3)
    assert summary["ran"] == 1 and summary["states"] == {"failed": 1}
    assert summary["failures_by_label"] == {"failed_precheck_precheck_docker_daemon": 1}


def test_huge_token_counts_in_codex_events_are_bounded(tmp_path: Path) -> None:
    events = tmp_path / "codex.stdout.log"
    huge = "9" * 5000
    events.write_text(
        '{"type": "turn.completed", "usage": {"input_tokens": ' + huge + ', "output_tokens": 7}}\n'
        '{"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 1' + "0" * 30 + '}}\n'
        '{"type": "turn.completed", "usage": {"input_tokens": 5, "output_tokens": 3}}\n'
    )
    usage = usage_from_events(events)
    assert usage.input_tokens == 15 and usage.output_tokens == 3 and usage.turns == 2
