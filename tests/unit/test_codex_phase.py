"""The codex phase with fake codex executables: argv, stdin prompt, allowlisted env, deadline."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from runner.context import JobContext
from runner.errors import CodexNotFoundError, PhaseError
from runner.jobroot import JobRoot
from runner.agents.codex import codex_argv
from runner.phases.agent import agent
from runner.tasks.spec import load_settings
from tests.conftest import FAKE_CODEX, agent_gone


def _ctx(tmp_path: Path, codex_bin: Path | str, prompt: str = "Fix it.\n", **settings) -> JobContext:
    job = JobRoot.at(tmp_path / "job", "demo_1")
    (job.root / "context").mkdir(parents=True)
    job.prompt.write_text(prompt)
    (job.buggy_source / "calc").mkdir(parents=True)
    (job.buggy_source / "calc" / "mathops.py").write_text("def add(a, b):\n    return a - b\n")
    return JobContext(settings=load_settings(tag="demo_1", codex_bin=str(codex_bin), **settings), job=job)


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "codex-script"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_the_fake_codex_fixes_the_tree_with_the_real_argv(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, FAKE_CODEX)
    result = agent(ctx)
    assert result.exit_code == 0 and result.reason == "ok" and not result.timed_out
    assert "add_impl" in (ctx.job.buggy_source / "calc" / "mathops.py").read_text()
    assert (ctx.job.buggy_source / "calc" / "_impl.py").exists()
    assert result.last_message_present and ctx.job.last_message.exists()
    assert result.stdout_bytes > 0 and len(result.stdout_sha256) == 64
    assert b"fake codex: mode fix" in (ctx.job.logs / "codex.stdout.log").read_bytes()
    prompt_chars = len(ctx.job.prompt.read_text())
    assert (result.turns, result.input_tokens, result.cached_input_tokens, result.output_tokens) == (
        2, 2 * (1000 + prompt_chars), 500, 240
    )


def test_the_prompt_goes_on_stdin_and_the_job_root_is_not_given(tmp_path: Path) -> None:
    script = _script(tmp_path, 'printf "%s\\n" "$@" > args.txt\ncat > stdin.txt\n')
    ctx = _ctx(tmp_path, script, prompt="the real prompt text\n")
    agent(ctx)
    args = (ctx.job.buggy_source / "args.txt").read_text().splitlines()
    assert args == codex_argv(str(script), ctx.job.buggy_source, ctx.job.last_message)[1:]
    assert args[-1] == "-" and "--add-dir" not in args and str(ctx.job.prompt) not in args
    assert (ctx.job.buggy_source / "stdin.txt").read_text() == "the real prompt text\n"


def test_the_child_environment_is_an_allowlist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-needed-by-codex")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-codex")
    monkeypatch.setenv("RUNNER_UNRELATED", "x")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    script = _script(tmp_path, "env > env.txt\n")
    ctx = _ctx(tmp_path, script)
    agent(ctx)
    names = {line.split("=", 1)[0] for line in (ctx.job.buggy_source / "env.txt").read_text().splitlines()}
    assert {"OPENAI_API_KEY", "PATH", "LC_ALL"} <= names
    assert not names & {"AWS_SECRET_ACCESS_KEY", "RUNNER_UNRELATED"}


def test_a_non_zero_exit_fails_the_phase_with_its_code(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, _script(tmp_path, "echo boom >&2\nexit 7\n"))
    with pytest.raises(PhaseError) as caught:
        agent(ctx)
    assert caught.value.reason == "codex_exit_nonzero" and caught.value.exit_code_observed == 7
    assert caught.value.details["stderr_bytes"] == 5
    assert "logs/codex.stderr.log" in str(caught.value)


def test_the_deadline_kills_the_whole_process_group(tmp_path: Path) -> None:
    script = _script(tmp_path, "sleep 300 &\necho $! > grandchild.pid\nsleep 300\n")
    ctx = _ctx(tmp_path, script, codex_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(PhaseError) as caught:
        agent(ctx)
    assert time.monotonic() - started < 15
    assert caught.value.reason == "codex_timeout" and caught.value.details["timed_out"] is True
    assert (ctx.job.buggy_source / "grandchild.pid").exists()
    assert agent_gone(ctx.job.buggy_source, seconds=5)


def test_a_missing_binary_is_an_environment_error(tmp_path: Path) -> None:
    with pytest.raises(CodexNotFoundError, match="--codex-bin"):
        agent(_ctx(tmp_path, tmp_path / "absent"))


def test_a_large_prompt_never_delays_the_deadline(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, _script(tmp_path, "sleep 300\n"), prompt="x" * 400_000 + "\n", codex_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(PhaseError) as caught:
        agent(ctx)
    assert caught.value.reason == "codex_timeout"
    assert time.monotonic() - started < 10


def test_a_relative_codex_bin_is_found_from_where_the_runner_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script(tmp_path, "cat > stdin.txt\n")
    monkeypatch.chdir(tmp_path)
    ctx = _ctx(tmp_path, f"./{script.name}")
    assert agent(ctx).exit_code == 0
    assert (ctx.job.buggy_source / "stdin.txt").read_text() == "Fix it.\n"


_LAST = 'while [ "$1" != "--output-last-message" ]; do shift; done; last=$2\n'


def test_an_empty_last_message_is_not_present(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, _script(tmp_path, _LAST + ': > "$last"\n'))
    result = agent(ctx)
    assert ctx.job.last_message.exists() and result.last_message_present is False


def test_a_failed_turn_is_a_model_error_and_an_infrastructure_failure(tmp_path: Path) -> None:
    failed = '{"type":"turn.failed","error":{"message":"Missing environment variable: `K`."}}'
    ctx = _ctx(tmp_path, _script(tmp_path, f"echo '{failed}'\nexit 1\n"))
    with pytest.raises(PhaseError) as caught:
        agent(ctx)
    assert caught.value.reason == "codex_model_error"
    assert caught.value.details["model_error"] == "missing_key" and caught.value.details["infra_failure"] is True
    assert "infrastructure failure" in str(caught.value)


def test_codex_gets_a_fresh_private_home_and_the_resolved_codex_home(tmp_path: Path) -> None:
    codex_home = tmp_path / "my-codex-home"
    (codex_home / "sessions").mkdir(parents=True)
    (codex_home / "config.toml").write_text('model = "m"\n')
    (codex_home / "history.jsonl").write_text("{}\n")
    script = _script(tmp_path, 'echo "$HOME|$CODEX_HOME" > where.txt; touch "$HOME/left-by-last-run"\n'
                     'ls -A "$CODEX_HOME" > codex-home.txt; cat "$CODEX_HOME/config.toml" >> codex-home.txt\n')
    ctx = _ctx(tmp_path, script, codex_home=str(codex_home))
    agent(ctx)
    agent(ctx)  # the second run starts from an empty HOME again
    home, seen_codex_home = (ctx.job.buggy_source / "where.txt").read_text().strip().split("|")
    # codex's own CODEX_HOME is private, in its HOME: the operator's config and login are linked,
    # what a session writes (its record, the history) is not, so it stays in the job root
    assert home == str(ctx.job.agent_home) and seen_codex_home == str(ctx.job.agent_home / "codex-home")
    assert (ctx.job.buggy_source / "codex-home.txt").read_text().split() == ["config.toml", "sessions", "model", "=", '"m"']
    assert (ctx.job.agent_home / "codex-home" / "config.toml").readlink() == codex_home / "config.toml"
    assert sorted(p.name for p in ctx.job.agent_home.iterdir()) == ["codex-home", "left-by-last-run"]
    assert list((codex_home / "sessions").iterdir()) == []
