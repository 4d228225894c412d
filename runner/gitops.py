"""The baseline repository: GitPython over a git directory the agent cannot reach.

Invariants:
- the runner's git directory is ``<job root>/.baseline.git``, outside ``buggy-source/``:
  nothing the agent writes (a ``.git/config`` with hooks or an fsmonitor, attributes
  drivers) is read by the runner's git; the system and global config are ignored too;
- the agent gets its own ``buggy-source/.git`` that borrows the baseline's objects
  (an alternates file) and index, so it can ``git diff`` its work at no extra cost;
  the runner never runs git on it, and git never adds a ``.git`` path.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from typing import Any

from git import Git, GitCommandError, Repo

from runner.containment.agent import die_with_parent_prefix

BASELINE_MESSAGE = "agentissue-runner baseline: buggy source as extracted"
BRANCH = "main"
IDENTITY = ("agentissue-runner", "runner@example.invalid")
# No system or global config; and, on every command, the settings that could run a program
# forced off (command-line config wins over any repository config, should it ever be changed).
_ISOLATION = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_CONFIG_COUNT": "2",
    "GIT_CONFIG_KEY_0": "core.fsmonitor",
    "GIT_CONFIG_VALUE_0": "false",
    "GIT_CONFIG_KEY_1": "core.hooksPath",
    "GIT_CONFIG_VALUE_1": os.devnull,
}
_SAFE_CONFIG = {
    ("user", "name"): IDENTITY[0],
    ("user", "email"): IDENTITY[1],
    ("commit", "gpgsign"): "false",
    ("core", "autocrlf"): "false",
    ("core", "hooksPath"): os.devnull,
    ("core", "fsmonitor"): "false",
    # The baseline is private scratch: storing loose objects uncompressed makes `git add`
    # of a large tree about 45% faster (20,000 files: 2.7 s -> 1.5 s) for more disk.
    ("core", "looseCompression"): "0",
    # Never an automatic gc: after the baseline commit of a large tree (over 6,700 loose
    # objects) git would fork a detached `gc` that repacks for many seconds beside the agent,
    # outlives the runner and writes the baseline while the patch is read from it.
    ("gc", "auto"): "0",
    ("maintenance", "auto"): "false",
}


# What git says (its LC_ALL is C) when a write fails for want of space: strerror, or its own words.
_DISK_FULL = {"No space left on device": errno.ENOSPC, "Out of diskspace": errno.ENOSPC,
              "Disk quota exceeded": errno.EDQUOT}


@contextmanager
def disk_full_is_the_disks() -> Iterator[None]:
    """A git that failed for want of space raises ``OSError(ENOSPC)``: the run then says the disk
    is full (free space, run again), where git's own error would say only that git failed."""
    try:
        yield
    except GitCommandError as e:
        code = next((code for text, code in _DISK_FULL.items() if text in str(e.stderr or "")), None)
        if code is None:
            raise
        raise OSError(code, os.strerror(code)) from e


# Lock files a git process holds while it writes; one left behind means that git died.
_GIT_LOCKS = ("index.lock", "HEAD.lock", "config.lock", "packed-refs.lock")


# The phase deadline (a time.monotonic() value) of the git commands started in this context, or
# None; set by runner.deadline.PhaseDeadline for extract and baseline.
GIT_DEADLINE: ContextVar[float | None] = ContextVar("GIT_DEADLINE", default=None)
# The least time a git is given when the deadline has all but passed: it is killed at once.
_LAST_MOMENT = 0.01


def _deadline_prefix() -> tuple[str, ...]:
    """``timeout -s KILL <left>``, when a phase deadline is set: coreutils' timeout puts the git in a
    process group of its own and kills the whole group (git and its children) at the deadline.

    Not GitPython's ``kill_after_timeout``: its watchdog is a non-daemon thread that an interrupt
    leaves running, so the interpreter waited for it (for the whole deadline) before it could exit.
    """
    ends_at = GIT_DEADLINE.get()
    timeout = shutil.which("timeout") if ends_at is not None else None
    if ends_at is None or timeout is None:
        return ()
    left = max(_LAST_MOMENT, ends_at - time.monotonic())
    return (timeout, "-s", "KILL", f"{left:.3f}s")


class _DyingGit(Git):
    """Every git the runner starts dies with the runner (kill -9, OOM), never outlives it, and
    is killed (with its children) at the phase's deadline when one is set (``GIT_DEADLINE``);
    the command then fails as a killed git. A long-lived ``as_process`` git (cat-file) is left alone."""

    def execute(self, command: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(command, (list, tuple)):
            deadline = () if kwargs.get("as_process") else _deadline_prefix()
            if deadline:  # timeout itself dies with the runner, and git with timeout
                command = [*die_with_parent_prefix(), *deadline, *die_with_parent_prefix(), *command]
            else:
                command = [*die_with_parent_prefix(), *command]
        return super().execute(command, *args, **kwargs)


class _Repo(Repo):
    GitCommandWrapperType = _DyingGit


def release_stale_git_locks(git_dir: Path) -> list[str]:
    """Remove the locks a git of a dead run left in the baseline (the caller holds the job
    root's lock, and the runner's git children die with it, so no git holds them)."""
    removed = []
    if not git_dir.is_dir() or git_dir.is_symlink():
        return removed
    candidates = [git_dir / name for name in _GIT_LOCKS]
    refs = git_dir / "refs"
    if refs.is_dir() and not refs.is_symlink():
        candidates += [p for p in refs.glob("**/*.lock")]
    for path in candidates:
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed.append(path.name)
    return removed


def _configure(repo: Repo) -> None:
    with repo.config_writer() as config:
        for (section, option), value in _SAFE_CONFIG.items():
            config.set_value(section, option, value)


def baseline_git(git_dir: Path, work_tree: Path) -> Git:
    """The baseline's git commands alone (no ``Repo``, which reads the repository in Python first):
    what a phase that only runs git needs."""
    git = _DyingGit(work_tree)
    git.update_environment(GIT_DIR=str(git_dir), GIT_WORK_TREE=str(work_tree), **_ISOLATION)
    return git


def open_baseline(git_dir: Path, work_tree: Path) -> Repo:
    repo = _Repo(git_dir)
    repo.git.update_environment(GIT_DIR=str(git_dir), GIT_WORK_TREE=str(work_tree), **_ISOLATION)
    return repo


def init_baseline(git_dir: Path, work_tree: Path) -> Repo:
    _Repo.init(git_dir, bare=True, initial_branch=BRANCH)
    repo = open_baseline(git_dir, work_tree)
    _configure(repo)
    with repo.config_writer() as config:
        config.set_value("core", "bare", "false")
    return repo


def pack_baseline_into(baseline: Repo, bare_dir: Path) -> None:
    """A bare repository at ``bare_dir`` holding the baseline branch as one pack, no path of the job.

    Stored, not compressed, and without deltas: packing 20,000 files then takes a fraction
    of a second rather than many seconds, and a checkout from it inflates nothing.
    git writes a pack to a temporary file in its object directory and renames it into place;
    so ``bare_dir``'s objects are that directory here (the baseline's are only read, as an
    alternate for this one command): the rename stays on ``bare_dir``'s file system, where a
    temporary file in the job's would fail to cross to another (EXDEV) and fill the job's disk.
    """
    _Repo.init(bare_dir, bare=True, initial_branch=BRANCH)
    objects = bare_dir / "objects"
    baseline.git.execute(
        ["git", "pack-objects", "--revs", "--window=0", "--depth=0", "--compression=0", "-q", str(objects / "pack" / "pack")],
        istream=_ref_input(BRANCH),
        env={"GIT_OBJECT_DIRECTORY": str(objects), "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(Path(baseline.git_dir) / "objects")},
    )
    cached = open_baseline(bare_dir, bare_dir)
    cached.git.update_ref(f"refs/heads/{BRANCH}", baseline.head.commit.hexsha)


def branch_commit(git_dir: Path) -> str:
    """The commit the baseline branch of ``git_dir`` names, as git itself reads it.

    Git, not GitPython's parsers, reads the repository: a damaged ``HEAD`` or config is then
    a ``GitCommandError`` like any other damage, never another exception type.
    """
    git = _DyingGit()
    git.update_environment(GIT_DIR=str(git_dir), **_ISOLATION)
    return git.rev_parse("--verify", f"refs/heads/{BRANCH}^{{commit}}")


def _ref_input(branch: str) -> Any:
    import tempfile

    handle = tempfile.TemporaryFile()
    handle.write(f"refs/heads/{branch}\n".encode())
    handle.seek(0)
    return handle


def checkout_baseline(repo: Repo, commit: str) -> None:
    """The work tree and index at ``commit``, written by git's parallel checkout."""
    repo.git.update_ref(f"refs/heads/{BRANCH}", commit)
    repo.git.execute(["git", "-c", "checkout.workers=0", "read-tree", "--reset", "-u", f"refs/heads/{BRANCH}"])


def give_agent_a_repository(baseline: Repo, git_dir: Path, work_tree: Path) -> None:
    """``work_tree/.git`` at the baseline commit, sharing the baseline's objects and index."""
    agent_git = work_tree / ".git"
    if agent_git.exists() or agent_git.is_symlink():
        shutil.rmtree(agent_git) if agent_git.is_dir() and not agent_git.is_symlink() else agent_git.unlink()
    agent = _Repo.init(agent_git, bare=True, initial_branch=BRANCH)
    agent.git.update_environment(GIT_DIR=str(agent_git), GIT_WORK_TREE=str(work_tree), **_ISOLATION)
    _configure(agent)
    with agent.config_writer() as config:
        config.set_value("core", "bare", "false")
    (agent_git / "objects" / "info" / "alternates").write_text(f"{git_dir / 'objects'}\n")
    shutil.copyfile(git_dir / "index", agent_git / "index")
    agent.git.update_ref(f"refs/heads/{BRANCH}", baseline.head.commit.hexsha)
