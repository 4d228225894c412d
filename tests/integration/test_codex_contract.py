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

from runner.phases.codex import codex_argv
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
