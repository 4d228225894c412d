"""Patch hygiene: build and cache artefacts stay out of the patch, whether or not .gitignore or the baseline held them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from runner import hygiene
from runner.context import JobContext
from runner.jobroot import JobRoot
from runner.phases.baseline import baseline
from runner.phases.patch import export_patch
from runner.tasks.spec import load_settings
from runner.errors import BadInputError


def _ctx(tmp_path: Path, *exclude: str) -> JobContext:
    job = JobRoot.at(tmp_path / "job", "demo_1")
    source = job.buggy_source
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    # a tree that tracks a bytecode file and has no .gitignore at all, as some real ones do
    (source / "pkg" / "__pycache__").mkdir()
    (source / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\x00old bytecode")
    return JobContext(settings=load_settings(tag="demo_1", patch_exclude=exclude or None), job=job)


def test_artefacts_are_left_out_and_counted(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    commit = baseline(ctx).baseline_commit
    source = ctx.job.buggy_source
    (source / "pkg" / "mod.py").write_text("def f():\n    return 2\n")
    subprocess.run(["python3", "-c", "import pkg.mod"], cwd=source, check=True)  # the agent runs the code
    (source / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\x00new bytecode")  # tracked, rewritten
    (source / "tests" / "__pycache__").mkdir(parents=True)
    (source / "tests" / "__pycache__" / "t.pyc").write_bytes(b"\x00")
    (source / ".pytest_cache" / "v").mkdir(parents=True)
    (source / ".pytest_cache" / "v" / "lastfailed").write_text("{}")
    (source / "node_modules" / "x").mkdir(parents=True)
    (source / "node_modules" / "x" / "index.js").write_text("1")
    (source / ".coverage").write_bytes(b"\x00sqlite")
    (source / "pkg.egg-info").mkdir()
    (source / "pkg.egg-info" / "PKG-INFO").write_text("Name: pkg")
    result = export_patch(ctx, commit)
    patch = ctx.job.patch.read_bytes()
    assert b"pyc" not in patch and b"GIT binary patch" not in patch
    for name in (b"node_modules", b".coverage", b"egg-info", b".pytest_cache", b"__pycache__"):
        assert name not in patch
    assert result.changed_file_count == 1 and result.binary_change_count == 0 and result.sensitive_file_count == 0
    assert result.artifact_files_left_out >= 6  # the rewritten tracked .pyc, the new ones, and each cache file
    applied = tmp_path / "applied"
    subprocess.run(["git", "--git-dir", str(ctx.job.baseline_git_dir), "worktree", "add", "-q", str(applied), commit],
                   check=True)
    done = subprocess.run(["patch", "-p1", "--batch", "--forward"], cwd=applied, input=patch, capture_output=True)
    assert done.returncode == 0, done.stdout


def test_a_deleted_artefact_is_left_out_too(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    commit = baseline(ctx).baseline_commit
    source = ctx.job.buggy_source
    (source / "pkg" / "__pycache__" / "mod.cpython-311.pyc").unlink()
    (source / "pkg" / "mod.py").write_text("def f():\n    return 3\n")
    result = export_patch(ctx, commit)
    assert b"pyc" not in ctx.job.patch.read_bytes() and result.artifact_files_left_out == 1


def test_the_operators_patterns_are_added(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, "dist/", "*.log")
    commit = baseline(ctx).baseline_commit
    source = ctx.job.buggy_source
    (source / "dist").mkdir()
    (source / "dist" / "pkg.tar.gz").write_bytes(b"\x1f\x8b")
    (source / "pkg" / "run.log").write_text("log")
    (source / "pkg" / "mod.py").write_text("def f():\n    return 4\n")
    result = export_patch(ctx, commit)
    patch = ctx.job.patch.read_bytes()
    assert b"dist/" not in patch and b"run.log" not in patch and result.artifact_files_left_out == 2


def test_only_artefacts_changed_is_an_empty_patch(tmp_path: Path) -> None:
    from runner.errors import PhaseError

    ctx = _ctx(tmp_path)
    commit = baseline(ctx).baseline_commit
    (ctx.job.buggy_source / ".coverage").write_bytes(b"\x00")
    with pytest.raises(PhaseError) as caught:
        export_patch(ctx, commit)
    assert caught.value.reason == "empty_patch"


def test_the_globs() -> None:
    assert hygiene._glob("__pycache__/") == ["**/__pycache__/**"]
    assert hygiene._glob("*.pyc") == ["**/*.pyc", "**/*.pyc/**"]
    assert hygiene._glob("/build/") == ["build/**"]
    assert hygiene._glob("docs/_build") == ["docs/_build", "docs/_build/**"]


@pytest.mark.parametrize("pattern", [":(top)x", "../x", "a b", "x\ny", "", "/"])
def test_a_bad_pattern_is_refused(pattern: str) -> None:
    with pytest.raises(BadInputError, match="patch-exclude"):
        load_settings(patch_exclude=(pattern,))
