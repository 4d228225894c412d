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
from runner import hygiene

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
    sensitive_file_count: int = 0
    artifact_files_left_out: int = 0


# Files through which a patch could sway a test without fixing anything: tests themselves and
# the interpreter's start-up hooks. Counted and reported, never hidden; they do not change the verdict.
_STARTUP_HOOKS = frozenset({"sitecustomize.py", "usercustomize.py", "conftest.py", "pytest.ini", "tox.ini"})


def _sensitive(path: str) -> bool:
    parts = path.split("/")
    name = parts[-1]
    return (
        name in _STARTUP_HOOKS
        or name.endswith(".pth")
        or name.startswith("test_")
        or name.endswith("_test.py")
        or any(part in ("test", "tests", "testing") for part in parts[:-1])
    )


def _summary(text: bytes) -> dict[str, int]:
    """Counts from the patch's own header lines (content lines always start with ' ', '+' or '-')."""
    counts = {"changed_file_count": 0, "added_file_count": 0, "deleted_file_count": 0,
              "hunk_count": 0, "binary_change_count": 0, "sensitive_file_count": 0}
    header = {b"diff --git ": "changed_file_count", b"new file mode ": "added_file_count",
              b"deleted file mode ": "deleted_file_count", b"@@ ": "hunk_count",
              b"GIT binary patch": "binary_change_count"}
    for line in text.split(b"\n"):
        if line.startswith(b"diff --git a/"):
            # "diff --git a/<path> b/<path>" with --no-renames: both halves are the same path
            path = line[len(b"diff --git a/"):].decode(errors="replace").rsplit(" b/", 1)[0]
            counts["sensitive_file_count"] += _sensitive(path)
        for prefix, key in header.items():
            if line.startswith(prefix):
                counts[key] += 1
                break
    return counts


def export_patch(ctx: JobContext, baseline_commit: str) -> PatchResult:
    """Raises: PhaseError ``empty_patch`` when the tree equals the baseline."""
    repo = open_baseline(ctx.job.baseline_git_dir, ctx.job.buggy_source)
    extra = ctx.settings.patch_exclude
    # stage new files too; .gitignore and the hygiene list (runner/hygiene.py) decide what is left out
    repo.git.add("--all", "--", *hygiene.excluding(extra))
    left_out = hygiene.left_out_count(repo, baseline_commit, extra)
    text = repo.git.diff(
        "--cached", *DIFF_OPTIONS, baseline_commit, "--", *hygiene.excluding(extra),
        stdout_as_string=False, strip_newline_in_stdout=False,
    )
    if not text:
        raise PhaseError("patch", "empty_patch", "the agent changed nothing: the diff against the baseline is empty")
    write_bytes_atomic(ctx.job.patch, text, mode=0o600)
    return PatchResult(
        patch_sha256=hashlib.sha256(text).hexdigest(), patch_bytes=len(text), artifact_files_left_out=left_out,
        **_summary(text),
    )
