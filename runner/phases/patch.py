"""patch: the work tree against the baseline, as a patch GNU ``patch -p1`` applies.

Invariants: new (untracked) files are included and ignored files are not; the
diff is taken against the baseline commit, so commits the agent made count too;
``a/``/``b/`` prefixes, no renames, no colour and no external diff, whatever the
host's git config says; binary changes are kept (binary-safe) and counted,
since GNU patch cannot carry them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from reducers.models import Phase
from runner.atomic import write_bytes_atomic
from runner.context import JobContext, PhaseResult
from runner.errors import PhaseError
from runner.gitops import open_baseline

DIFF_OPTIONS = (
    "--binary",
    "--full-index",
    "--no-color",
    "--no-ext-diff",
    "--no-renames",
    "--no-textconv",
    "--src-prefix=a/",
    "--dst-prefix=b/",
)


@dataclass(frozen=True)
class PatchResult(PhaseResult):
    phase = Phase.PATCH
    patch_sha256: str = ""
    patch_bytes: int = 0
    changed_file_count: int = 0
    added_file_count: int = 0
    deleted_file_count: int = 0
    hunk_count: int = 0
    binary_change_count: int = 0


def export_patch(ctx: JobContext, baseline_commit: str) -> PatchResult:
    """Raises: PhaseError ``empty_patch`` when the tree equals the baseline."""
    repo = open_baseline(ctx.job.baseline_git_dir, ctx.job.buggy_source)
    repo.git.add("--all")  # stage new files too; .gitignore decides what is left out
    numstat = repo.git.diff("--cached", "--numstat", "-z", "--no-renames", baseline_commit)
    status = repo.git.diff("--cached", "--name-status", "-z", "--no-renames", baseline_commit)
    text = repo.git.diff("--cached", *DIFF_OPTIONS, baseline_commit, stdout_as_string=False, strip_newline_in_stdout=False)
    # numstat -z: "added\tdeleted\tpath\0" per file; "-\t-" marks a binary change.
    entries = [entry for entry in numstat.split("\0") if entry]
    binary = sum(1 for entry in entries if entry.startswith("-\t-\t"))
    codes = status.split("\0")[0::2]
    if not entries:
        raise PhaseError("patch", "empty_patch", "the agent changed nothing: the diff against the baseline is empty")
    write_bytes_atomic(ctx.job.patch, text, mode=0o600)
    hunks = sum(1 for line in text.split(b"\n") if line.startswith(b"@@ "))
    return PatchResult(
        patch_sha256=hashlib.sha256(text).hexdigest(),
        patch_bytes=len(text),
        changed_file_count=len(entries),
        added_file_count=codes.count("A"),
        deleted_file_count=codes.count("D"),
        hunk_count=hunks,
        binary_change_count=binary,
    )
