"""baseline: one commit of the extracted tree, the reference the patch is taken against.

Invariants: the baseline lives in the runner's own git directory outside the
agent's tree (see ``runner.gitops``); a half-made baseline (a crash between
init and commit) is discarded and made again; the agent gets a repository of
its own at the same commit; the phase has its own deadline (``--extract-timeout``,
counted afresh): past it every git it started is killed, the half-made baseline
is removed and the task fails as an infrastructure failure (``baseline_timeout``).
"""

from __future__ import annotations

import shutil

from git import BadName, InvalidGitRepositoryError, NoSuchPathError

from reducers.models import BaselineResult
from runner.context import JobContext
from runner.deadline import PhaseDeadline
from runner.errors import PhaseError, PhaseTimeoutError
from runner.jobroot import JobRoot
from runner.gitops import BASELINE_MESSAGE, disk_full_is_the_disks, give_agent_a_repository, init_baseline, open_baseline


def _existing_baseline(job: JobRoot) -> str | None:
    """The commit of a whole baseline left by an earlier run, or None (half-made ones are removed)."""
    git_dir = job.baseline_git_dir
    if not git_dir.exists():
        return None
    try:
        head = open_baseline(git_dir, job.buggy_source).head.commit
        if head.message.strip() == BASELINE_MESSAGE and not head.parents:
            return head.hexsha
    except (InvalidGitRepositoryError, NoSuchPathError, BadName, ValueError):
        pass  # no commit yet: the run stopped between init and commit
    shutil.rmtree(git_dir)
    return None


def build_baseline(job: JobRoot) -> str:
    """The baseline commit of ``buggy-source/``: a whole one left by an earlier run, or a new one.

    Raises: PhaseError ``empty_source`` when there is no extracted tree to commit;
    OSError ``ENOSPC`` when git failed for want of space (the run says the disk is full).
    """
    source = job.buggy_source
    if not source.is_dir() or not any(entry.name != ".git" for entry in source.iterdir()):
        raise PhaseError("baseline", "empty_source", "buggy-source/ is missing or empty; rerun extract")
    commit = _existing_baseline(job)
    if commit is None:
        with disk_full_is_the_disks():
            repo = init_baseline(job.baseline_git_dir, source)
            repo.git.add("--all")  # git itself does the heavy adding; .gitignore is respected
            repo.git.commit("--no-verify", "--allow-empty", "-q", "-m", BASELINE_MESSAGE)
        commit = repo.head.commit.hexsha
    return commit


def baseline(ctx: JobContext) -> BaselineResult:
    """Raises: PhaseError ``empty_source`` when there is no extracted tree to commit;
    PhaseTimeoutError ``baseline_timeout`` past its deadline (the half-made baseline removed)."""
    try:
        with PhaseDeadline("baseline", ctx.settings.extract_timeout, flag="--extract-timeout"):
            return _baseline(ctx)
    except PhaseTimeoutError:
        # The rerun would find and discard it too; removed now, so no half-made state waits for it.
        if ctx.job.baseline_git_dir.exists():
            shutil.rmtree(ctx.job.baseline_git_dir, ignore_errors=True)
        raise


def _baseline(ctx: JobContext) -> BaselineResult:
    job = ctx.job
    build_baseline(job)
    repo = open_baseline(job.baseline_git_dir, job.buggy_source)
    give_agent_a_repository(repo, job.baseline_git_dir, job.buggy_source)
    tracked = repo.git.ls_files("-z").count("\0")
    return BaselineResult(baseline_commit=repo.head.commit.hexsha, tracked_file_count=tracked)
