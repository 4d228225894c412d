"""Clear answers on a real Docker Engine (issue 11, "wrong or unclear answers")."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from tests.conftest import FAKE_CODEX, make_job_root, read_json, run_cli, stub_args

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]


def _wrapper(tmp_path: Path, version_line: str) -> Path:
    """A codex whose ``--version`` line carries more than a version (a wrapper's token, say)."""
    path = tmp_path / "bin" / "codex"
    path.parent.mkdir()
    path.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = --version ]; then echo "{version_line}"; exit 0; fi\n'
        f'exec "{sys.executable}" "{FAKE_CODEX}" "$@"\n'
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_secret_in_codex_version_output_is_kept_out_at_the_source(tmp_path: Path, stub_image: str) -> None:
    secret = "sk-version-leak-0123456789abcdef"
    codex = _wrapper(tmp_path, f"codex-cli 0.171.0 (token {secret})")
    job = make_job_root(tmp_path)
    done = run_cli("--execute", *stub_args(job, stub_image, codex=codex), env={"OPENAI_API_KEY": secret})
    assert done.returncode == 0, done.stderr[-2000:]
    run = read_json(job / "benchmark_run.compact.json")
    assert run["official_task_score"]["resolved"] is True
    assert run["codex"]["version"] == "codex-cli 0.171.0"
    for path in [*job.glob("*.json"), *(job / "result-markers").iterdir()]:
        assert secret not in path.read_text()
    assert secret not in done.stdout and secret not in done.stderr


def test_without_git_help_works_and_precheck_names_git(tmp_path: Path, stub_image: str) -> None:
    bin_dir = tmp_path / "bin"  # PATH: python and codex, but no git
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    assert shutil.which("git", path=str(bin_dir)) is None
    env = {"PATH": str(bin_dir)}
    done = run_cli("--help", env=env)
    assert done.returncode == 0, done.stderr
    assert "usage: python -m runner" in done.stdout
    job = make_job_root(tmp_path)
    done = run_cli("--precheck", "--image", stub_image, "--codex-bin", str(FAKE_CODEX), env=env)
    assert done.returncode == 3, done.stderr
    failed = {c["name"]: c["detail"] for c in __import__("json").loads(done.stdout)["checks"] if not c["ok"]}
    assert list(failed) == ["git_binary"] and "install git" in failed["git_binary"]
    done = run_cli("--execute", *stub_args(job, stub_image), env=env)
    assert done.returncode == 3 and "git binary was not found" in done.stderr
    assert not (job / "buggy-source").exists()
    assert os.path.exists(job / "benchmark_run.compact.json")
