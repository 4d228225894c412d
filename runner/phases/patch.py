"""patch: the work tree against the baseline, as a patch GNU ``patch -p1`` applies.

Invariants: new (untracked) files are included and ignored files are not; the
diff is taken against the baseline commit, so commits the agent made count too;
``a/``/``b/`` prefixes, no renames, no colour and no external diff, whatever the
host's git config says; binary changes are kept (binary-safe) and counted,
since GNU patch cannot carry them.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from git import Repo

from reducers.models import PatchResult
from runner.context import JobContext
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


# What a patch may carry: a fix is kilobytes; an agent's stray gigabyte file must not be
# exported, copied into the evaluation or held in memory. Past it the phase fails `patch_too_large`.
PATCH_MAX_BYTES = 64 * 1024 * 1024
# What git may read of any one changed file: `git add` and `git diff --binary` hold a file (and
# its deflated, base85 form) whole, so a file past this is refused by its size, before git reads
# it; the phase's peak (the runner and its git children) then stays well under 100 MB.
FILE_MAX_BYTES = 8 * 1024 * 1024
STREAM_CHUNK = 1024 * 1024
_HEADER_PREFIX_BYTES = 8192  # of each line, enough for any header; content lines are never held
_C_ESCAPES = {ord("a"): 7, ord("b"): 8, ord("t"): 9, ord("n"): 10, ord("v"): 11, ord("f"): 12, ord("r"): 13}


def _unquote(raw: bytes) -> tuple[bytes, bytes]:
    """A git C-quoted path (``"tests/\\303\\274ber/x.py"`` for non-ASCII names), without its
    opening quote: (the path's bytes, what follows the closing quote)."""
    out, i = bytearray(), 0
    while i < len(raw):
        c = raw[i]
        if c == ord('"'):
            return bytes(out), raw[i + 1:]
        if c == ord("\\") and i + 1 < len(raw):
            n = raw[i + 1]
            if ord("0") <= n <= ord("7"):
                out.append(int(raw[i + 1:i + 4], 8) & 0xFF)
                i += 4
                continue
            out.append(_C_ESCAPES.get(n, n))
            i += 2
            continue
        out.append(c)
        i += 1
    return bytes(out), b""


def _diff_path(header: bytes) -> str:
    """The path of a ``diff --git a/<path> b/<path>`` line (with --no-renames both are the same),
    quoted or not."""
    rest = header[len(b"diff --git "):]
    if rest.startswith(b'"'):
        path, _ = _unquote(rest[1:])
        path = path[2:] if path.startswith(b"a/") else path
    else:
        path = rest[2:].rsplit(b" b/", 1)[0] if rest.startswith(b"a/") else rest
    return path.decode(errors="replace")


class PatchCounter:
    """Counts from the patch's own header lines, fed chunk by chunk (content lines always start
    with ' ', '+' or '-'); it keeps only the start of the current line, never the patch."""

    _HEADERS = ((b"diff --git ", "changed_file_count"), (b"new file mode ", "added_file_count"),
                (b"deleted file mode ", "deleted_file_count"), (b"@@ ", "hunk_count"),
                (b"GIT binary patch", "binary_change_count"))

    def __init__(self) -> None:
        self.counts = {"changed_file_count": 0, "added_file_count": 0, "deleted_file_count": 0,
                       "hunk_count": 0, "binary_change_count": 0, "sensitive_file_count": 0}
        self._line = bytearray()

    def _end_line(self, line: bytes) -> None:
        for prefix, key in self._HEADERS:
            if line.startswith(prefix):
                self.counts[key] += 1
                if key == "changed_file_count":
                    self.counts["sensitive_file_count"] += _sensitive(_diff_path(line))
                return

    def feed(self, chunk: bytes) -> None:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            room = _HEADER_PREFIX_BYTES - len(self._line)
            if room > 0:
                self._line += piece[:room]
            if end < 0:
                return
            self._end_line(bytes(self._line))
            self._line.clear()
            start = end + 1

    def close(self) -> dict[str, int]:
        if self._line:
            self._end_line(bytes(self._line))
            self._line.clear()
        return self.counts


def diffstat(text: bytes) -> list[tuple[str, int, int]]:
    """(path, lines added, lines removed) per file of a whole patch held in memory (the private views)."""
    files: list[tuple[str, int, int]] = []
    path, added, removed, in_hunk = None, 0, 0, False
    for line in text.split(b"\n"):
        if line.startswith(b"diff --git "):
            if path is not None:
                files.append((path, added, removed))
            path, added, removed, in_hunk = _diff_path(line), 0, 0, False
        elif line.startswith(b"@@ "):
            in_hunk = True
        elif in_hunk and line.startswith(b"+"):
            added += 1
        elif in_hunk and line.startswith(b"-"):
            removed += 1
    if path is not None:
        files.append((path, added, removed))
    return files


def count_patch(text: bytes) -> dict[str, int]:
    """The header counts of a whole patch held in memory (the audit's gold patch)."""
    counter = PatchCounter()
    counter.feed(text)
    return counter.close()


def _stream_diff(
    repo: Repo, baseline_commit: str, dest: Path, pathspecs: list[str] | tuple[str, ...] = ()
) -> tuple[str, int, dict[str, int]]:
    """``git diff`` streamed into ``dest`` (atomically), hashed and counted as it goes.

    Raises: PhaseError ``patch_too_large`` past PATCH_MAX_BYTES (git is stopped, nothing written).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    digest, counter, size = hashlib.sha256(), PatchCounter(), 0
    process = repo.git.diff("--cached", *DIFF_OPTIONS, baseline_commit, "--", *pathspecs, as_process=True)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as sink:
            for chunk in iter(lambda: process.proc.stdout.read(STREAM_CHUNK), b""):
                size += len(chunk)
                if size > PATCH_MAX_BYTES:
                    raise PhaseError(
                        "patch", "patch_too_large",
                        f"the diff against the baseline exceeds {PATCH_MAX_BYTES // (1024 * 1024)} MiB, the most "
                        "a patch may carry; the agent left large files in the tree",
                        details={"patch_max_bytes": PATCH_MAX_BYTES},
                    )
                digest.update(chunk)
                counter.feed(chunk)
                sink.write(chunk)
            sink.flush()
            os.fsync(sink.fileno())
        process.wait()  # GitCommandError when git failed
        if size:
            os.replace(tmp, dest)
    except BaseException:
        if process.proc is not None and process.proc.poll() is None:
            process.proc.kill()
            process.proc.wait()
        raise
    finally:
        Path(tmp).unlink(missing_ok=True)
        for pipe in (process.proc.stdout, process.proc.stderr) if process.proc is not None else ():
            if pipe is not None:
                pipe.close()
    return digest.hexdigest(), size, counter.close()


def _nul_separated(repo: Repo, *args: str) -> Iterator[bytes]:
    """The paths a git listing prints with ``-z``, read as they come: an agent's million new files
    are never one string in memory."""
    process = repo.git.execute(["git", *args], as_process=True)
    pending = b""
    try:
        for chunk in iter(lambda: process.proc.stdout.read(STREAM_CHUNK), b""):
            *names, pending = (pending + chunk).split(b"\0")
            yield from (name for name in names if name)
        if pending:
            yield pending
        process.wait()
    finally:
        if process.proc is not None and process.proc.poll() is None:
            process.proc.kill()
            process.proc.wait()
        for pipe in (process.proc.stdout, process.proc.stderr) if process.proc is not None else ():
            if pipe is not None:
                pipe.close()


def _refuse_large_files(repo: Repo, work_tree: Path, pathspecs: Sequence[str]) -> None:
    """Every changed or new file git would read, by ``lstat`` alone: ``diff-files`` compares the
    index's stat data and ``ls-files --others`` reads directories, so no content is read here.

    Raises: PhaseError ``patch_too_large`` when a file is past FILE_MAX_BYTES.
    """
    over = 0
    for listing in (("diff-files", "--name-only", "-z"), ("ls-files", "--others", "--exclude-standard", "-z")):
        for name in _nul_separated(repo, *listing, "--", *pathspecs):
            try:
                status = os.lstat(work_tree / os.fsdecode(name))
            except OSError:  # deleted, or gone since: nothing of it to read
                continue
            over += stat.S_ISREG(status.st_mode) and status.st_size > FILE_MAX_BYTES
    if over:
        raise PhaseError(
            "patch", "patch_too_large",
            f"{over} changed file(s) exceed {FILE_MAX_BYTES // (1024 * 1024)} MiB, the most a patch may carry "
            "of one file; the agent left large files in the tree (left unread)",
            details={"file_max_bytes": FILE_MAX_BYTES, "files_over_limit": over},
        )


def export_patch(ctx: JobContext, baseline_commit: str) -> PatchResult:
    """Raises: PhaseError ``empty_patch`` when the tree equals the baseline, ``patch_too_large``."""
    repo = open_baseline(ctx.job.baseline_git_dir, ctx.job.buggy_source)
    extra = ctx.settings.patch_exclude
    pathspecs = hygiene.excluding(extra)
    # The index back at the baseline (a rerun finds what an earlier attempt of this phase staged);
    # -m keeps the stat data of unchanged entries, so nothing unchanged is read again.
    repo.git.read_tree("-m", baseline_commit)
    _refuse_large_files(repo, ctx.job.buggy_source, pathspecs)
    # stage new files too; .gitignore and the hygiene list (runner/hygiene.py) decide what is left out
    repo.git.add("--all", "--", *pathspecs)
    left_out = hygiene.left_out_count(repo, baseline_commit, extra)
    sha256, size, counts = _stream_diff(repo, baseline_commit, ctx.job.patch, pathspecs)
    if not size:
        raise PhaseError("patch", "empty_patch", "the agent changed nothing: the diff against the baseline is empty")
    return PatchResult(patch_sha256=sha256, patch_bytes=size, artifact_files_left_out=left_out, **counts)
