"""Settings precedence and the CLI's refusals: bad input exits 2 before any work, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.errors import BadInputError
from runner.tasks.spec import load_settings
from tests.conftest import FAKE_CODEX, run_cli


def test_flags_win_over_the_reference_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAG", "env_tag_1")
    monkeypatch.setenv("ALLOW_DOCKER_PULL", "1")
    monkeypatch.setenv("PATCH_TEST_SH", "run-tests")
    monkeypatch.setenv("CONTAINER_BUGGY_SOURCE", "/src/buggy/")
    from_env = load_settings()
    assert from_env.tag == "env_tag_1" and from_env.allow_pull is True and from_env.test_cmd == "run-tests"
    assert from_env.source_dir == "/src/buggy"
    assert from_env.resolved_image == "alfin06/agentissue-bench:env_tag_1"
    assert load_settings(tag="flag_tag_2").tag == "flag_tag_2"


def test_defaults_match_the_reference() -> None:
    settings = load_settings()
    assert settings.tag == "lagent_239" and settings.codex_bin == "codex"
    assert settings.apply_cmd == "/usr/local/bin/run_test_entrypoint.sh apply_patch /patches/attempt.patch"
    assert settings.test_cmd == "/usr/local/bin/run_test_entrypoint.sh test_patched"
    assert settings.source_dir == "/app/source_code_buggy" and settings.eval_network.value == "bridge"


@pytest.mark.parametrize(
    "flags",
    [
        {"tag": "has space"}, {"tag": "../up"}, {"tag": "x;rm -rf /"}, {"tag": "a" * 10_000},
        {"image": "img $(id)"}, {"image": "../x"}, {"source_dir": "relative/dir"}, {"source_dir": "/app/../etc"},
        {"apply_cmd": "two\nlines"}, {"codex_timeout": 0},
    ],
)
def test_unsafe_values_are_refused_with_the_setting_named(flags: dict) -> None:
    with pytest.raises(BadInputError) as caught:
        load_settings(**flags)
    assert "--" + next(iter(flags)).replace("_", "-") in str(caught.value)  # the flag as typed


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--tag", "bad tag"), ("--tag", "../../etc"), ("--tag", "t;reboot"), ("--tag", "x" * 10_240),
        ("--image", "img`id`"), ("--image", "a b"), ("--image", "i" * 10_240),
        ("--source-dir", "/app/$(id)"), ("--source-dir", "/app/../../etc"),
        ("--job-root", "JOB/with space"), ("--job-root", "JOB/../elsewhere"), ("--job-root", "JOB/x;rm"),
    ],
)
def test_cli_refuses_unsafe_values_before_any_work(tmp_path: Path, flag: str, value: str) -> None:
    job = tmp_path / "job"
    args = ["--execute", "--job-root", str(job), flag, value.replace("JOB", str(job))]
    done = run_cli(*args, env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert done.returncode == 2, done.stderr
    assert f"{flag}:" in done.stderr  # the flag as the user typed it
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("prompt", "message"),
    [(None, "no context/prompt.md"), ("   \n", "empty"),
     ("# Synthetic AgentIssue-Bench lagent_239 Prompt Placeholder\n", "synthetic placeholder")],
)
def test_cli_refuses_a_bad_prompt_before_any_work(tmp_path: Path, prompt: str | None, message: str) -> None:
    job = tmp_path / "job"
    (job / "context").mkdir(parents=True)
    if prompt is not None:
        (job / "context" / "prompt.md").write_text(prompt)
    before = sorted(p.relative_to(job) for p in job.rglob("*"))
    done = run_cli("--execute", "--job-root", str(job), "--codex-bin", str(FAKE_CODEX),
                   env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert sorted(p.relative_to(job) for p in job.rglob("*")) == before


def test_execute_needs_a_job_root() -> None:
    done = run_cli("--execute")
    assert done.returncode == 2 and "--job-root" in done.stderr


@pytest.mark.parametrize(
    "modes",
    [("--execute", "--reduce"), ("--precheck", "--execute"), ("--sweep", "--list-tags"), ("--cache", "list", "--reduce")],
)
def test_modes_are_exclusive(modes: tuple[str, ...]) -> None:
    done = run_cli(*modes)
    assert done.returncode == 2 and "not allowed with argument" in done.stderr  # argparse's group, not a later check


def test_plan_in_markdown() -> None:
    """The plan touches neither Docker nor a file, so it is a unit test."""
    done = run_cli("--format", "markdown")
    assert done.returncode == 0
    assert done.stdout.startswith("# runner: plan") and "## phases" in done.stdout


def test_reduce_on_a_job_root_never_run_names_the_missing_marker(tmp_path: Path) -> None:
    done = run_cli("--reduce", "--job-root", str(tmp_path))
    assert done.returncode == 2 and "prepare.json" in done.stderr


@pytest.mark.parametrize(
    ("command", "subcommand", "script"),
    [
        ("/usr/local/bin/run_test_entrypoint.sh test_patched", "test_patched", "/usr/local/bin/run_test_entrypoint.sh"),
        ("env; /opt/run.sh test_patched; echo done", "test_patched", "/opt/run.sh"),
        ("/usr/local/bin/run_test_entrypoint.sh apply_patch /patches/attempt.patch", "apply_patch",
         "/usr/local/bin/run_test_entrypoint.sh"),
        ("pytest -q tests/", "test_patched", None),
        ("echo 'unbalanced", "test_patched", None),
    ],
)
def test_the_probe_finds_the_script_a_command_calls(command: str, subcommand: str, script: str | None) -> None:
    from runner.phases.precheck import script_calling

    assert script_calling(command, subcommand) == script


def test_the_extract_deadline_reaches_the_settings_and_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--extract-timeout`` (and ``RUNNER_EXTRACT_TIMEOUT``, below the flag) is the deadline of extract and of
    baseline; the plan shows it beside codex's."""
    import json

    from runner.plan import build_plan
    from runner.settings import DEFAULT_EXTRACT_TIMEOUT

    assert load_settings().extract_timeout == DEFAULT_EXTRACT_TIMEOUT == 1800.0
    monkeypatch.setenv("RUNNER_EXTRACT_TIMEOUT", "42")
    assert load_settings().extract_timeout == 42.0
    assert load_settings(extract_timeout=7.0).extract_timeout == 7.0
    assert build_plan(load_settings())["extract_timeout_seconds"] == 42.0
    monkeypatch.delenv("RUNNER_EXTRACT_TIMEOUT")
    done = run_cli("--tag", "lagent_239", "--extract-timeout", "12.5")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["extract_timeout_seconds"] == 12.5 and plan["codex_timeout_seconds"] == 3600.0
    done = run_cli("--tag", "lagent_239", env={"RUNNER_EXTRACT_TIMEOUT": "33"})
    assert json.loads(done.stdout)["extract_timeout_seconds"] == 33.0
