"""Patch export: new files in, ignored files out, binary changes counted, and GNU patch -p1 applies it."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from runner.context import JobContext
from runner.errors import PhaseError
from runner.jobroot import JobRoot
from runner.phases.baseline import baseline
from runner.phases.patch import export_patch
from runner.tasks.spec import load_settings
from runner.gitops import init_baseline, open_baseline


@pytest.fixture
def ctx(tmp_path: Path) -> JobContext:
    job = JobRoot.at(tmp_path / "job", "demo_1")
    source = job.buggy_source
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (source / "notes.txt").write_text("no final newline")
    (source / "data.bin").write_bytes(b"\x00\x01\x02" * 10)
    (source / ".gitignore").write_text("*.log\n")
    return JobContext(settings=load_settings(tag="demo_1"), job=job)


def _pristine_copy(ctx: JobContext, commit: str, dest: Path) -> Path:
    archive = subprocess.run(
        ["git", "--git-dir", str(ctx.job.baseline_git_dir), "archive", commit], capture_output=True, check=True
    ).stdout
    dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tree:
        tree.extractall(dest, filter="data")
    return dest


def _git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, check=True).stdout


def test_text_changes_and_new_files_apply_with_gnu_patch(ctx: JobContext, tmp_path: Path) -> None:
    commit = baseline(ctx).baseline_commit
    source = ctx.job.buggy_source
    (source / "pkg" / "mod.py").write_text("def f():\n    return 2\n")
    (source / "pkg" / "new.py").write_text("VALUE = 3\n")
    (source / "notes.txt").write_text("still no final newline, changed")
    (source / "debug.log").write_text("ignored\n")
    result = export_patch(ctx, commit)
    patch = ctx.job.patch.read_bytes()
    assert b"--- /dev/null\n+++ b/pkg/new.py" in patch
    assert b"debug.log" not in patch
    assert (result.changed_file_count, result.added_file_count, result.binary_change_count) == (3, 1, 0)
    assert result.hunk_count == 3 and result.patch_bytes == len(patch)

    plain = _pristine_copy(ctx, commit, tmp_path / "plain")
    applied = subprocess.run(["patch", "-p1", "--batch", "--forward"], cwd=plain, input=patch, capture_output=True)
    assert applied.returncode == 0, applied.stdout
    for name in ("pkg/mod.py", "pkg/new.py", "notes.txt"):
        assert (plain / name).read_bytes() == (source / name).read_bytes(), name


def test_binary_changes_are_kept_and_counted(ctx: JobContext) -> None:
    commit = baseline(ctx).baseline_commit
    (ctx.job.buggy_source / "data.bin").write_bytes(b"\xff\x00" * 40)
    result = export_patch(ctx, commit)
    assert result.binary_change_count == 1
    assert b"GIT binary patch" in ctx.job.patch.read_bytes()


def test_the_agent_has_its_own_repository_and_its_commits_still_count(ctx: JobContext) -> None:
    commit = baseline(ctx).baseline_commit
    source = ctx.job.buggy_source
    assert _git(source, "rev-parse", "HEAD").strip() == commit
    assert _git(source, "status", "--porcelain") == ""
    (source / "pkg" / "mod.py").write_text("def f():\n    return 9\n")
    assert "pkg/mod.py" in _git(source, "diff", "--name-only")
    _git(source, "commit", "-qam", "agent commit")
    result = export_patch(ctx, commit)
    assert result.changed_file_count == 1
    assert b".git/" not in ctx.job.patch.read_bytes()


def test_the_agents_git_config_never_runs_in_the_runner(ctx: JobContext, tmp_path: Path) -> None:
    commit = baseline(ctx).baseline_commit
    source = ctx.job.buggy_source
    proof = tmp_path / "fsmonitor-ran"
    hook = tmp_path / "monitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch {proof}\n")
    hook.chmod(0o755)
    with (source / ".git" / "config").open("a") as config:
        config.write(f"[core]\n\tfsmonitor = {hook}\n\thooksPath = {tmp_path}\n")
    (source / ".gitattributes").write_text("* filter=evil\n")
    (source / "pkg" / "mod.py").write_text("def f():\n    return 5\n")
    result = export_patch(ctx, commit)
    assert result.changed_file_count == 2  # the edit and the new .gitattributes
    assert not proof.exists(), "the agent's git config ran code in the runner's git"


def test_a_half_made_baseline_is_made_again(ctx: JobContext) -> None:
    init_baseline(ctx.job.baseline_git_dir, ctx.job.buggy_source)  # a crash right after init
    result = baseline(ctx)
    assert result.tracked_file_count == 4
    assert len(list(open_baseline(ctx.job.baseline_git_dir, ctx.job.buggy_source).iter_commits())) == 1


def test_baseline_refuses_an_empty_tree(tmp_path: Path) -> None:
    job = JobRoot.at(tmp_path / "job", "demo_1")
    job.buggy_source.mkdir(parents=True)
    with pytest.raises(PhaseError) as caught:
        baseline(JobContext(settings=load_settings(tag="demo_1"), job=job))
    assert caught.value.reason == "empty_source"


def test_an_unchanged_tree_is_the_empty_patch_failure(ctx: JobContext) -> None:
    commit = baseline(ctx).baseline_commit
    with pytest.raises(PhaseError) as caught:
        export_patch(ctx, commit)
    assert caught.value.reason == "empty_patch"
    assert not ctx.job.patch.exists()


def test_baseline_is_one_commit_of_everything_not_ignored(ctx: JobContext) -> None:
    (ctx.job.buggy_source / "build.log").write_text("x")
    result = baseline(ctx)
    assert result.tracked_file_count == 4
    repo = open_baseline(ctx.job.baseline_git_dir, ctx.job.buggy_source)
    assert len(list(repo.iter_commits("--all"))) == 1
    assert baseline(ctx).baseline_commit == result.baseline_commit  # a rerun reuses it


def test_deletions_and_mode_changes_are_counted_from_the_patch(ctx: JobContext) -> None:
    commit = baseline(ctx).baseline_commit
    source = ctx.job.buggy_source
    (source / "notes.txt").unlink()
    (source / "pkg" / "mod.py").chmod(0o755)
    result = export_patch(ctx, commit)
    assert (result.changed_file_count, result.deleted_file_count, result.added_file_count) == (2, 1, 0)
    assert result.hunk_count == 1  # the deletion; a mode change has no hunk


def test_even_a_changed_baseline_config_runs_nothing(ctx: JobContext, tmp_path: Path) -> None:
    commit = baseline(ctx).baseline_commit
    proof = tmp_path / "ran"
    hook = tmp_path / "monitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch {proof}\n")
    hook.chmod(0o755)
    with (ctx.job.baseline_git_dir / "config").open("a") as config:
        config.write(f"[core]\n\tfsmonitor = {hook}\n")
    (ctx.job.buggy_source / "pkg" / "mod.py").write_text("def f():\n    return 7\n")
    assert export_patch(ctx, commit).changed_file_count == 1
    assert not proof.exists()


def test_patches_to_tests_and_startup_hooks_are_counted(ctx: JobContext) -> None:
    commit = baseline(ctx).baseline_commit
    source = ctx.job.buggy_source
    (source / "tests").mkdir()
    (source / "tests" / "helper.py").write_text("X = 1\n")
    (source / "sitecustomize.py").write_text("print('FIX CONFIRMED')\n")
    (source / "pkg" / "mod.py").write_text("def f():\n    return 3\n")
    result = export_patch(ctx, commit)
    assert (result.changed_file_count, result.sensitive_file_count) == (3, 2)
