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
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator, Sequence
from typing import BinaryIO
from pathlib import Path

from git import Git

from reducers.models import PatchResult
from runner.context import JobContext
from runner.errors import PhaseError
from runner.gitops import baseline_git
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

    # Where a header line may start, inside a chunk's whole lines (the regex engine skips the
    # content lines in C; a Python loop over every line took a third of the diff's own time).
    _HEADER_STARTS = re.compile(rb"^(?:diff --git |new file mode |deleted file mode |@@ |GIT binary patch)", re.M)

    def feed(self, chunk: bytes) -> None:
        first = chunk.find(b"\n")
        room = _HEADER_PREFIX_BYTES - len(self._line)
        if first < 0:  # the current line goes on
            if room > 0:
                self._line += chunk[:room]
            return
        if room > 0:
            self._line += chunk[:min(first, room)]
        self._end_line(bytes(self._line))
        self._line.clear()
        last = chunk.rfind(b"\n")
        for match in self._HEADER_STARTS.finditer(chunk, first + 1, last + 1):
            start = match.start()
            end = chunk.find(b"\n", start, last + 1)
            self._end_line(chunk[start:min(end, start + _HEADER_PREFIX_BYTES)])
        self._line += chunk[last + 1:last + 1 + _HEADER_PREFIX_BYTES]

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
    git: Git, baseline_commit: str, dest: Path, pathspecs: list[str] | tuple[str, ...] = ()
) -> tuple[str, int, dict[str, int]]:
    """``git diff`` streamed into ``dest`` (atomically), hashed and counted as it goes.

    Raises: PhaseError ``patch_too_large`` past PATCH_MAX_BYTES (git is stopped, nothing written).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    digest, counter, size = hashlib.sha256(), PatchCounter(), 0
    process = git.diff("--cached", *DIFF_OPTIONS, baseline_commit, "--", *pathspecs, as_process=True)
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


def _nul_separated(git: Git, *args: str, istream: BinaryIO | None = None) -> Iterator[bytes]:
    """The paths a git listing prints with ``-z``, read as they come: an agent's million new files
    are never one string in memory."""
    return _names_of(git.execute(["git", *args], as_process=True, istream=istream))


def _split_nul(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The NUL-separated names in a stream of chunks, one chunk held at a time."""
    pending = b""
    for chunk in chunks:
        *names, pending = (pending + chunk).split(b"\0")
        yield from (name for name in names if name)
    if pending:
        yield pending


def _names_of(process) -> Iterator[bytes]:  # a GitPython AutoInterrupt
    return _split_nul(_chunks_of(process))


def _chunks_of(process) -> Iterator[bytes]:  # a GitPython AutoInterrupt
    """A git's output as it comes; its failure raised once it has ended (GitCommandError)."""
    try:
        yield from iter(lambda: process.proc.stdout.read(STREAM_CHUNK), b"")
        process.wait()
    finally:
        if process.proc is not None and process.proc.poll() is None:
            process.proc.kill()
            process.proc.wait()
        for pipe in (process.proc.stdout, process.proc.stderr) if process.proc is not None else ():
            if pipe is not None:
                pipe.close()


# In the baseline's git directory (the runner's, out of the agent's reach): the patch's own copy of
# the baseline's index, which it stages into (the baseline's is never written after its commit, so
# every attempt of this phase starts from it), and the throw-away index that sorts the changed
# paths into the patch's and the artefacts.
_PATCH_INDEX = "runner-patch-index"
_SORTING_INDEX = "runner-sorting-index"
_EMPTY_BLOB = b"e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"


def _list_file(git_dir: Path) -> BinaryIO:
    """A list of paths: in memory while small (an unchanged tree makes no file at all), in a file of
    the baseline's git directory past a megabyte, or once git is to read it."""
    return tempfile.SpooledTemporaryFile(max_size=STREAM_CHUNK, dir=git_dir)  # type: ignore[return-value]


def _index_copy(source: Path, copy: Path) -> None:
    """The baseline's index as the patch's, to stage into: a second name for the same file (git never
    writes an index in place; it writes a new file and renames it over the name it staged into, so
    the baseline's stays as it is), or a copy where the file system has no links. Its mtime is the
    baseline's either way, so git's racy-entry rule holds as it would on the original."""
    copy.unlink(missing_ok=True)
    try:
        os.link(source, copy)
    except OSError:
        shutil.copy2(source, copy)


def _changed_paths(git: Git, tracked: BinaryIO, new: BinaryIO, needles: list[bytes] | None) -> list[tuple[int, bool]]:
    """Every path ``git add --all`` would look at, NUL-separated: into ``tracked`` the tracked ones
    whose stat data differ from the index (changed, deleted, a file become a directory:
    ``diff-files``, which stats in parallel), into ``new`` the new ones ``.gitignore`` does not
    ignore (``ls-files --others``, the walk; an embedded repository as ``dir/``), the two gits
    running at once. Returns, for each, how many and whether any may be an artefact (holds one
    of ``runner.hygiene.needles``). Neither list holds a path and one under it; the two together may."""
    started = [git.execute(["git", *argv], as_process=True)
               for argv in (("diff-files", "--name-only", "-z"), ("ls-files", "-z", "--others", "--exclude-standard"))]
    found = []
    try:
        for process, listing in zip(started, (tracked, new)):
            count, suspect = _copy_listing(_chunks_of(process), listing, needles)
            found.append((count, suspect))
    finally:
        for process in started:  # the other one, when reading the first failed
            if process.proc is not None and process.proc.poll() is None:
                process.proc.kill()
                process.proc.wait()
    return found


def _copy_listing(chunks: Iterator[bytes], listing: BinaryIO, needles: list[bytes] | None) -> tuple[int, bool]:
    """A git ``-z`` listing copied into ``listing`` a chunk at a time; returns how many names it
    holds and whether any may be an artefact. The names are NUL-separated and no needle holds a
    NUL, so a needle in the chunks (with the end of the chunk before) is a needle in a name."""
    count, suspect, carried, ends_whole = 0, needles is None, b"", True
    keep = max(map(len, needles or ()), default=1) - 1  # what a needle cut between chunks needs
    for chunk in chunks:
        listing.write(chunk)
        count += chunk.count(b"\0")
        ends_whole = chunk.endswith(b"\0")
        if not suspect:
            window = carried + chunk
            suspect = any(needle in window for needle in needles)
            carried = window[len(window) - keep:]
    if not ends_whole:  # a last name without its NUL
        listing.write(b"\0")
        count += 1
    listing.flush()
    return count, suspect


def _sort_out_artefacts(git: Git, git_dir: Path, listing: BinaryIO, kept: BinaryIO, extra: Sequence[str]) -> int:
    """The changed paths the patch may carry (``runner.hygiene``'s patterns left out), NUL-separated
    into ``kept``; returns how many. Git's own pathspec matching decides, on a throw-away index that
    holds only the changed paths (as empty blobs: no content is read), never the whole tree's."""
    index = git_dir / _SORTING_INDEX
    index.unlink(missing_ok=True)
    entries = _list_file(git_dir)
    try:
        for name in _Slice(listing, 0).names():
            entries.write(b"100644 " + _EMPTY_BLOB + b"\t" + name.rstrip(b"/") + b"\0")
        entries.seek(0)
        with git.custom_environment(GIT_INDEX_FILE=str(index)):
            git.execute(["git", "update-index", "-z", "--index-info"], istream=entries)
            count = 0
            for name in _nul_separated(git, "ls-files", "-z", "--", *hygiene.excluding(extra)):
                kept.write(name + b"\0")
                count += 1
        kept.flush()
        return count
    finally:
        entries.close()
        index.unlink(missing_ok=True)


def _under_real_directories(name: bytes, root: bytes, real_dirs: set[bytes]) -> bool:
    """Is every leading directory of ``name`` (a path under ``root``, which ends in ``/``) a directory
    still, not a file or a symlink now? (``real_dirs``: those seen to be, so each is looked at once.)"""
    unseen = []
    parent = name.rpartition(b"/")[0]
    while parent not in real_dirs:
        unseen.append(parent)
        parent = parent.rpartition(b"/")[0]
    for directory in reversed(unseen):  # from the top down: the first that is no more decides
        path = root + directory
        if os.path.islink(path) or not os.path.isdir(path):
            return False
        real_dirs.add(directory)
    return True


class _Slice:
    """The part of a list file from ``start`` to its end, as the paths it holds."""

    def __init__(self, stream: BinaryIO, start: int) -> None:
        self.stream, self.start, self.end = stream, start, stream.tell()

    def names(self) -> Iterator[bytes]:
        return _split_nul(self._chunks())

    def _chunks(self) -> Iterator[bytes]:
        self.stream.seek(self.start)
        left = self.end - self.start
        while left > 0:
            chunk = self.stream.read(min(STREAM_CHUNK, left))
            if not chunk:
                return
            left -= len(chunk)
            yield chunk


def _check_and_split(work_tree: Path, kept: list[_Slice], to_stage: BinaryIO, to_remove: BinaryIO) -> bool:
    """Every kept path by ``lstat`` alone (no content is read): a file past FILE_MAX_BYTES is refused
    before git reads it; a tracked file that became a plain directory, or one under a directory that
    is a file or a symlink now, goes to ``to_remove``, every other path to ``to_stage``. Returns
    whether a path changed its type under a tracked one (a file became a directory, a directory a
    file or a symlink): what now stands there is only listed once the old entries are gone, so the
    caller lists again.

    Raises: PhaseError ``patch_too_large`` when a file is past FILE_MAX_BYTES.
    """
    over, type_changed, real_dirs, root = 0, False, {b""}, os.fsencode(work_tree) + b"/"
    for name in (name.rstrip(b"/") for part in kept for name in part.names()):  # an embedded repository's dir/
        path = root + name
        if not _under_real_directories(name, root, real_dirs):  # the path is no more: its entry goes
            to_remove.write(name + b"\0")
            type_changed = True
            continue
        try:
            status = os.lstat(path)
        except OSError:  # deleted, or gone since: nothing of it to read
            to_stage.write(name + b"\0")
            continue
        over += stat.S_ISREG(status.st_mode) and status.st_size > FILE_MAX_BYTES
        plain_dir = stat.S_ISDIR(status.st_mode) and not os.path.lexists(path + b"/.git")
        type_changed = type_changed or plain_dir
        (to_remove if plain_dir else to_stage).write(name + b"\0")
    if over:
        raise PhaseError(
            "patch", "patch_too_large",
            f"{over} changed file(s) exceed {FILE_MAX_BYTES // (1024 * 1024)} MiB, the most a patch may carry "
            "of one file; the agent left large files in the tree (left unread)",
            details={"file_max_bytes": FILE_MAX_BYTES, "files_over_limit": over},
        )
    return type_changed


def _stage(git: Git, to_stage: BinaryIO, to_remove: BinaryIO) -> None:
    """The kept paths into the index, as ``git add --all`` would stage them (new, changed, deleted;
    symlinks as symlinks, an embedded repository as a gitlink), touching no other entry."""
    for argv, paths in ((("--force-remove",), to_remove), (("--add", "--remove", "--replace"), to_stage)):
        if paths.tell():
            paths.flush()
            paths.seek(0)
            git.execute(["git", "update-index", "-z", *argv, "--stdin"], istream=paths)


# A path that changed its type under a tracked one is seen whole on the second listing; a third is
# a margin (nothing the agent can make needs it).
_MOST_PASSES = 3


def _stage_changes(git: Git, git_dir: Path, work_tree: Path, extra: Sequence[str]) -> tuple[int, int, bool]:
    """One pass: the changed paths listed, sorted, checked and the patch's staged. Returns the
    artefacts left out (every pass lists them all: they are never staged), how many paths were
    staged, and whether a type changed (``_check_and_split``)."""
    with _list_file(git_dir) as tracked, _list_file(git_dir) as new, _list_file(git_dir) as sorted_out, \
            _list_file(git_dir) as to_stage, _list_file(git_dir) as to_remove:
        changed = staged = 0
        kept: list[BinaryIO] = []
        for listing, (count, suspect) in zip((tracked, new), _changed_paths(git, tracked, new, hygiene.needles(extra))):
            changed += count
            if not count:
                continue
            if suspect:  # sorted one list at a time: a sorting index cannot hold a path and one under it
                start = sorted_out.tell()
                staged += _sort_out_artefacts(git, git_dir, listing, sorted_out, extra)
                kept.append(_Slice(sorted_out, start))
            else:  # none of them can be an artefact: all are the patch's
                staged += count
                kept.append(_Slice(listing, 0))
        type_changed = False
        if staged:
            type_changed = _check_and_split(work_tree, kept, to_stage, to_remove)
            _stage(git, to_stage, to_remove)
        return changed - staged, staged, type_changed


def export_patch(ctx: JobContext, baseline_commit: str) -> PatchResult:
    """Raises: PhaseError ``empty_patch`` when the tree equals the baseline, ``patch_too_large``.

    Staged into a copy of the baseline's index (its stat data, its mtime: git's racy-entry rule
    holds as it would on the original), so only what changed is ever read: one listing, the
    changed paths sorted by git's pathspecs, the kept ones staged, one diff.
    """
    git_dir, work_tree = ctx.job.baseline_git_dir, ctx.job.buggy_source
    git = baseline_git(git_dir, work_tree)
    index = git_dir / _PATCH_INDEX
    _index_copy(git_dir / "index", index)
    try:
        with git.custom_environment(GIT_INDEX_FILE=str(index)):
            staged = 0
            for _pass in range(_MOST_PASSES):
                left_out, staged_now, type_changed = _stage_changes(git, git_dir, work_tree, ctx.settings.patch_exclude)
                staged += staged_now
                if not type_changed:
                    break
            if not staged:  # nothing but artefacts changed, or nothing at all: the diff would be empty
                raise PhaseError("patch", "empty_patch",
                                 "the agent changed nothing: the diff against the baseline is empty")
            sha256, size, counts = _stream_diff(git, baseline_commit, ctx.job.patch)
    finally:
        index.unlink(missing_ok=True)
    if not size:
        raise PhaseError("patch", "empty_patch", "the agent changed nothing: the diff against the baseline is empty")
    return PatchResult(patch_sha256=sha256, patch_bytes=size, artifact_files_left_out=left_out, **counts)
