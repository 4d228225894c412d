"""baseline: one commit of the extracted tree, the reference the patch is taken against.

Invariant: the baseline is the runner's own repository (the image's history was
never extracted); a crash between commit and marker is recognised and reused.
"""

from __future__ import annotations

from dataclasses import dataclass

from git import InvalidGitRepositoryError

from reducers.models import Phase
from runner.context import JobContext, PhaseResult
from runner.errors import BadInputError
from runner.gitops import BASELINE_MESSAGE, init_repo, open_repo
from runner.jobroot import BUGGY_SOURCE


@dataclass(frozen=True)
class BaselineResult(PhaseResult):
    phase = Phase.BASELINE
    baseline_commit: str = ""
    tracked_file_count: int = 0


def baseline(ctx: JobContext) -> BaselineResult:
    """Raises: BadInputError when buggy-source holds a repository that is not our baseline."""
    source = ctx.job.buggy_source
    if (source / ".git").exists():
        try:
            repo = open_repo(source)
            head = repo.head.commit
        except (InvalidGitRepositoryError, ValueError) as e:
            raise BadInputError(f"{BUGGY_SOURCE}/.git is not a usable repository; move it aside") from e
        if head.message.strip() != BASELINE_MESSAGE or head.parents:
            raise BadInputError(
                f"{BUGGY_SOURCE}/ holds a git history that is not the runner's baseline; move it aside"
            )
    else:
        repo = init_repo(source)
        repo.git.add("--all")  # git itself does the heavy adding; .gitignore is respected
        repo.git.commit("--no-verify", "--allow-empty", "-q", "-m", BASELINE_MESSAGE)
        head = repo.head.commit
    tracked = len(repo.git.ls_files("-z").split("\0")) - 1
    return BaselineResult(baseline_commit=head.hexsha, tracked_file_count=max(tracked, 0))
