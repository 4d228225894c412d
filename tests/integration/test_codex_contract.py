"""Contract: every flag the runner passes to ``codex exec`` is one the real Codex CLI documents.

Skips where the real CLI is absent, except under CI=true, where .ci/run installs
@openai/codex from the npm registry and a skip would hide a broken contract.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from runner.agents.codex import codex_argv
from tests.conftest import IN_CI

pytestmark = pytest.mark.codex_contract


def _real_codex() -> str:
    found = os.environ.get("CODEX_CONTRACT_BIN") or shutil.which("codex")
    if found is None:
        if IN_CI:
            pytest.fail("CI=true and the real Codex CLI is not installed (npm install -g @openai/codex)")
        pytest.skip("the real Codex CLI is not installed (npm install -g @openai/codex)")
    return found


def test_every_runner_flag_is_in_codex_exec_help(tmp_path: Path) -> None:
    codex = _real_codex()
    done = subprocess.run([codex, "exec", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    documented = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", done.stdout))
    argv = codex_argv(codex, tmp_path / "buggy-source", tmp_path / "last.txt")
    assert argv[1] == "exec"
    flags = [arg for arg in argv[2:] if arg.startswith("--")]
    assert flags, "the runner passes no flags?"
    missing = [flag for flag in flags if flag not in documented]
    assert not missing, f"codex exec --help does not document {missing}"
    # The prompt comes from stdin: the help must say '-' reads it there.
    assert "stdin" in done.stdout and argv[-1] == "-"
    assert re.search(r"possible values:[^\n]*workspace-write", done.stdout)


def test_codex_reports_a_version() -> None:
    done = subprocess.run([_real_codex(), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and re.match(r"codex-cli \d+\.\d+", done.stdout)


def test_every_guard_override_is_a_key_the_real_codex_knows(tmp_path: Path) -> None:
    """``--strict-config`` refuses an unknown ``-c`` key: one real run with every guard must succeed."""
    from runner.canary.model_server import KEY_VARIABLE, ScriptedModel, message, turn, write_codex_home
    from runner.codex_config import GUARD_OVERRIDES, guard_arguments

    codex = _real_codex()
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run(["git", "init", "-q", str(work)], check=True)

    def run(*overrides: str) -> subprocess.CompletedProcess:
        with ScriptedModel([turn(message("hello"))]) as model:
            home = write_codex_home(tmp_path / "codex-home", model.base_url)
            return subprocess.run(
                [codex, "exec", "--strict-config", "--json", "--ephemeral", "--cd", str(work), *overrides, "-"],
                input="hi", capture_output=True, text=True, timeout=120,
                env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CODEX_HOME": str(home), KEY_VARIABLE: "k"},
            )

    guarded = run(*guard_arguments())
    assert guarded.returncode == 0, guarded.stderr[-2000:]
    assert '"turn.completed"' in guarded.stdout
    # the same check refuses a key codex does not know, so the pass above means something
    for key, _value in GUARD_OVERRIDES:
        misspelled = run("-c", f"{key}_misspelled=true")
        assert misspelled.returncode != 0 and "unknown configuration field" in misspelled.stderr, key


def test_the_model_and_profile_flags_are_documented(tmp_path: Path) -> None:
    done = subprocess.run([_real_codex(), "exec", "--help"], capture_output=True, text=True, timeout=60)
    argv = codex_argv("codex", tmp_path, tmp_path / "last.txt", model="m", profile="p", overrides=("a.b=1",))
    assert {"--model", "--profile", "--config"} <= set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", done.stdout))
    assert "-c" in argv and argv[argv.index("--model") + 1] == "m" and argv[argv.index("--profile") + 1] == "p"
    # the runner's guards come last: a later -c wins in codex, so the operator's cannot undo them
    assert argv.index("a.b=1") < argv.index("allow_login_shell=false")


def test_a_later_override_wins_so_the_guards_hold_over_the_operators(tmp_path: Path) -> None:
    """The runner puts its guards after the operator's ``-c``: codex must take the later value."""
    from runner.canary.model_server import KEY_VARIABLE, ScriptedModel, exec_call, message, turn, write_codex_home
    from runner.codex_config import guard_arguments

    work = tmp_path / "work"
    work.mkdir()
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    with ScriptedModel([turn(exec_call("echo hi")), turn(message("done"))]) as model:
        home = write_codex_home(tmp_path / "codex-home", model.base_url)
        done = subprocess.run(
            [_real_codex(), "exec", "--json", "--ephemeral", "--cd", str(work), "-c", "allow_login_shell=true",
             *guard_arguments(), "-"],
            input="hi", capture_output=True, text=True, timeout=120,
            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CODEX_HOME": str(home), KEY_VARIABLE: "k"},
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "/bin/bash -c" in done.stdout and "/bin/bash -lc" not in done.stdout
