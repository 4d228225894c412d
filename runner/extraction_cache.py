"""The extraction cache: one extracted tree and its baseline per (image id, source dir), per host.

Why: attempts of a task, and later suites on the same image, would otherwise extract
the same tree from Docker and commit the same baseline again (seconds per attempt on
a 20,000-file tree, half a minute on 1 GB).

Invariants:
- the cache lives in the runner's state directory (``<state>/extract-cache``, 0700),
  outside every job root and agent tree;
- an attempt shares nothing writable with it: the baseline's pack is copied (never
  hard-linked, no alternates into the cache), and the tree is checked out from the
  job's own copy; an agent that rewrites its tree or its ``.git`` changes only its own;
- an entry is used only after it is checked: its branch must name the recorded baseline
  commit and its files must have the recorded digests; a bad entry is discarded and the
  attempt extracts again;
- one lock per key (``flock``): two first attempts on one image extract once, the
  second waits and then takes the entry;
- its size is bounded: after a fill, least recently used entries go until the rest fit;
- it never fails a run: a cache whose file system refuses it (full, read-only, another
  disk than the job's) is a warning, and the attempt extracts without it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import tarfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import structlog
from git import GitCommandError
from pydantic import BaseModel, ConfigDict, ValidationError

from runner.atomic import write_bytes_atomic
from runner.context import sha256_file
from runner.errors import CacheEntryError
from runner.journal import default_state_dir
from runner.settings import RunnerSettings
from runner.gitops import (
    branch_commit,
    checkout_baseline,
    disk_full_is_the_disks,
    init_baseline,
    open_baseline,
    pack_baseline_into,
)
from runner.trees import remove_tree, walk

log = structlog.get_logger(__name__)

CACHE_SUBDIR = "extract-cache"
ENTRY_FILE = "entry.json"
BASELINE_DIR = "baseline.git"
EXTRAS_TAR = "extras.tar"  # what git does not keep: ignored files, empty directories
SCHEMA = "extract_cache_entry_v1"
GIB = 1024**3
# What the cache's own file operations and git raise when its disk or an entry fails it.
CACHE_FAULTS: tuple[type[Exception], ...] = (OSError, GitCommandError, tarfile.TarError)
WITHOUT_THE_CACHE = "extracted without the cache; free space on its disk or move it with --cache-dir"


class TreeStats(BaseModel):
    """The extraction's counts, kept so a hit reports what the first extraction found."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    files: int
    directories: int
    symlinks: int
    bytes: int
    oracle_entries_skipped: int


class EntryRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: str = SCHEMA
    key: str
    image_id: str
    image_digest: str | None
    source_dir_sha256: str
    baseline_commit: str
    stats: TreeStats
    file_sha256: dict[str, str]  # path relative to the entry -> digest, checked before use
    disk_bytes: int
    created_at: float


@dataclass(frozen=True)
class CacheListing:
    key: str
    image_id: str
    source_dir_sha256: str
    baseline_commit: str
    files: int
    disk_bytes: int
    last_used_at: float

    def public(self) -> dict[str, object]:
        return {
            "key": self.key,
            "image_id": self.image_id,
            "source_dir_sha256": self.source_dir_sha256,
            "baseline_commit": self.baseline_commit,
            "files": self.files,
            "disk_bytes": self.disk_bytes,
            "last_used_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.last_used_at)),
        }


def why(error: BaseException) -> str:
    """A public-safe cause: the error's type and errno name, or git's exit status; never its
    text, which names paths."""
    if isinstance(error, OSError) and error.errno:
        return f"{type(error).__name__}: {errno.errorcode.get(error.errno, error.errno)}"
    if isinstance(error, GitCommandError):
        return f"git exited {error.status}"
    return type(error).__name__


def cache_key(image_id: str, source_dir: str) -> str:
    return hashlib.sha256(f"{image_id}\0{source_dir}".encode()).hexdigest()[:32]


def _disk_bytes(root: Path) -> int:
    return sum(entry.stat(follow_symlinks=False).st_size for _rel, entry in walk(root) if entry.is_file(follow_symlinks=False))


class ExtractionCache:
    def __init__(self, root: Path, *, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes

    @classmethod
    def for_settings(cls, settings: RunnerSettings) -> ExtractionCache:
        """The host's cache: ``--cache-dir``, else ``<state dir>/extract-cache``; bounded by ``--cache-max-gb``."""
        root = settings.cache_dir or (settings.state_dir or default_state_dir()) / CACHE_SUBDIR
        return cls(root, max_bytes=int(settings.cache_max_gb * GIB))

    def _ensure_root(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root, 0o700)

    def entry_dir(self, key: str) -> Path:
        return self.root / key

    def free_bytes(self) -> int | None:
        try:
            found = os.statvfs(self.root)
        except OSError:
            return None
        return found.f_bavail * found.f_frsize

    @contextmanager
    def locked(self, key: str, *, blocking: bool = True, wait_seconds: float | None = None) -> Iterator[bool]:
        """Hold the key's lock for the block; yields False when ``blocking`` is off and it is held,
        or when the cache's file system refuses the lock (``cache_unavailable``): go without it.

        ``wait_seconds``: wait that long at most (the phase's deadline), then yield False too.
        """
        try:
            self._ensure_root()
            fd = os.open(self.root / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            log.warning("cache_unavailable", key=key[:12], reason=why(e), action=WITHOUT_THE_CACHE)
            yield False
            return
        try:
            if not _take_lock(fd, blocking=blocking, wait_seconds=wait_seconds):
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def _record(self, key: str) -> EntryRecord | None:
        path = self.entry_dir(key) / ENTRY_FILE
        if not path.is_file():
            return None
        try:
            return EntryRecord.model_validate_json(path.read_bytes())
        except (OSError, ValidationError) as e:
            raise CacheEntryError(f"cache entry {key[:12]}: unreadable record ({type(e).__name__})") from e

    def lookup(self, key: str) -> EntryRecord | None:
        """The checked entry of ``key``, or None (a bad one is removed). Call under the key's lock."""
        try:
            record = self._record(key)
            if record is None:
                return None
            self._check(key, record, digests=False)  # the digests are checked during the checkout
        except CacheEntryError as e:
            log.warning("cache_entry_discarded", key=key[:12], reason=str(e))
            self.discard(key)
            return None
        try:
            os.utime(self.entry_dir(key) / ENTRY_FILE)  # least recently used is by this time
        except OSError:
            pass  # a read-only cache still serves; its order of use is only a hint
        return record

    def _check(self, key: str, record: EntryRecord, *, digests: bool = True) -> None:
        entry = self.entry_dir(key)
        if record.key != key:
            raise CacheEntryError(f"cache entry {key[:12]}: records another key")
        for relative, wanted in record.file_sha256.items():
            path = entry / relative
            try:
                same = path.is_file() and not path.is_symlink() and (not digests or sha256_file(path) == wanted)
            except OSError:
                same = False
            if not same:
                raise CacheEntryError(f"cache entry {key[:12]}: {relative} is not what was stored")
        try:
            head = branch_commit(entry / BASELINE_DIR)
        except GitCommandError as e:
            raise CacheEntryError(f"cache entry {key[:12]}: its baseline does not resolve") from e
        if head != record.baseline_commit:
            raise CacheEntryError(f"cache entry {key[:12]}: its baseline is not the recorded commit")

    def discard(self, key: str) -> None:
        """Remove ``key``'s entry; a file system that refuses is a warning (the next lookup checks it again)."""
        entry = self.entry_dir(key)
        try:
            if entry.exists() or entry.is_symlink():
                trash = self.root / f".trash-{key}-{uuid.uuid4().hex[:8]}"
                entry.rename(trash)
                remove_tree(trash)
        except OSError as e:
            log.warning("cache_unavailable", key=key[:12], reason=why(e), action="the entry stays until it can go")

    def store(
        self,
        key: str,
        *,
        image_id: str,
        image_digest: str | None,
        source_dir: str,
        baseline_git_dir: Path,
        tree: Path,
        stats: TreeStats,
    ) -> EntryRecord | None:
        """Fill ``key`` from a job's fresh extraction (``tree``) and its baseline. Call under the key's lock.

        None when the cache's disk (or git on it) fails the fill: the job has its own tree and
        baseline already, so that is a warning (``cache_fill_failed``), and nothing half-made stays.
        """
        try:
            with disk_full_is_the_disks():
                return self._store(key, image_id=image_id, image_digest=image_digest, source_dir=source_dir,
                                   baseline_git_dir=baseline_git_dir, tree=tree, stats=stats)
        except CACHE_FAULTS as e:
            log.warning("cache_fill_failed", key=key[:12], reason=why(e), free_bytes=self.free_bytes(),
                        action=WITHOUT_THE_CACHE)
            return None

    def _store(
        self, key: str, *, image_id: str, image_digest: str | None, source_dir: str, baseline_git_dir: Path,
        tree: Path, stats: TreeStats,
    ) -> EntryRecord:
        self._ensure_root()
        staging = self.root / f".staging-{key}-{uuid.uuid4().hex[:8]}"
        staging.mkdir(mode=0o700)
        try:
            baseline = open_baseline(baseline_git_dir, tree)
            commit = baseline.head.commit.hexsha
            pack_baseline_into(baseline, staging / BASELINE_DIR)  # one pack, never the job's loose files
            tracked = set(baseline.git.ls_files("-z").split("\0")) - {""}
            _write_extras(tree, tracked, staging / EXTRAS_TAR)
            digests = {
                str(path.relative_to(staging)): sha256_file(path)
                for path in (staging / EXTRAS_TAR, *sorted((staging / BASELINE_DIR / "objects" / "pack").glob("pack-*")))
            }
            record = EntryRecord(
                key=key,
                image_id=image_id,
                image_digest=image_digest,
                source_dir_sha256=hashlib.sha256(source_dir.encode()).hexdigest(),
                baseline_commit=commit,
                stats=stats,
                file_sha256=digests,
                disk_bytes=_disk_bytes(staging),
                created_at=time.time(),
            )
            write_bytes_atomic(staging / ENTRY_FILE, record.model_dump_json().encode(), mode=0o600)
            self.discard(key)
            staging.rename(self.entry_dir(key))
        finally:
            if staging.exists():
                remove_tree(staging)
        log.info("cache_entry_stored", key=key[:12], disk_bytes=record.disk_bytes)
        self.prune(keep=key)
        return record

    def checkout(self, key: str, record: EntryRecord, *, baseline_git_dir: Path, tree: Path) -> None:
        """A fresh copy for one attempt: its own baseline (pack copied) and its tree checked out from it.

        Raises:
            CacheEntryError: the entry is bad (the caller discards it).
            OSError, GitCommandError, tarfile.TarError: the checkout failed and the entry is sound,
                checked whole: the job's side failed (its disk is full), the entry stays.
        """
        entry = self.entry_dir(key)
        if baseline_git_dir.exists():
            shutil.rmtree(baseline_git_dir)
        tree.mkdir(parents=True)
        try:
            self._checkout(entry, record, baseline_git_dir, tree)
        except BaseException as e:
            # Nothing of a failed checkout stays: a baseline holding the entry's commit would
            # pass for the job's own when the attempt extracts again.
            for made in (baseline_git_dir, tree):
                if made.exists():
                    remove_tree(made)
            if isinstance(e, CACHE_FAULTS):
                try:
                    self._check(key, record)
                except CacheEntryError as bad:
                    raise bad from e
            raise

    def _checkout(self, entry: Path, record: EntryRecord, baseline_git_dir: Path, tree: Path) -> None:
        key = record.key
        repo = init_baseline(baseline_git_dir, tree)
        pack_dir = baseline_git_dir / "objects" / "pack"
        pack_dir.mkdir(parents=True, exist_ok=True)
        for source in sorted((entry / BASELINE_DIR / "objects" / "pack").glob("pack-*")):
            shutil.copyfile(source, pack_dir / source.name)  # a copy: nothing of the cache is shared
        # The copies are hashed while git checks the tree out (hashlib runs outside the GIL);
        # the tree is placed only when every digest is the recorded one.
        copies = {relative: baseline_git_dir / relative.removeprefix(f"{BASELINE_DIR}/")
                  for relative in record.file_sha256 if relative.startswith(f"{BASELINE_DIR}/")}
        with ThreadPoolExecutor(max_workers=1) as pool:
            wrong = pool.submit(_mismatched, record.file_sha256, {**copies, EXTRAS_TAR: entry / EXTRAS_TAR})
            checkout_baseline(repo, record.baseline_commit)
            bad = wrong.result()
        if bad:
            raise CacheEntryError(f"cache entry {key[:12]}: {bad[0]} is not what was stored")
        with tarfile.open(entry / EXTRAS_TAR, mode="r:") as extras:
            extras.extractall(tree, filter="data")

    def entries(self) -> list[CacheListing]:
        if not self.root.is_dir():
            return []
        found = []
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            try:
                record = self._record(entry.name)
            except CacheEntryError:
                record = None
            if record is None:
                continue
            found.append(CacheListing(
                key=record.key, image_id=record.image_id, source_dir_sha256=record.source_dir_sha256,
                baseline_commit=record.baseline_commit, files=record.stats.files, disk_bytes=record.disk_bytes,
                last_used_at=(entry / ENTRY_FILE).stat().st_mtime,
            ))
        return found

    def prune(self, *, keep: str | None = None, max_bytes: int | None = None) -> list[str]:
        """Remove least recently used entries until the rest fit; entries in use (locked) stay."""
        limit = self.max_bytes if max_bytes is None else max_bytes
        listing = sorted(self.entries(), key=lambda item: item.last_used_at)
        total = sum(item.disk_bytes for item in listing)
        removed = []
        for item in listing:
            if total <= limit:
                break
            if item.key == keep:
                continue
            with self.locked(item.key, blocking=False) as got:
                if not got:
                    continue
                self.discard(item.key)
            total -= item.disk_bytes
            removed.append(item.key)
            log.info("cache_entry_pruned", key=item.key[:12], disk_bytes=item.disk_bytes)
        for stale in self.root.glob(".staging-*") if self.root.is_dir() else []:
            if time.time() - stale.stat().st_mtime > 3600:  # left by a fill that died
                remove_tree(stale)
        return removed


def _take_lock(fd: int, *, blocking: bool, wait_seconds: float | None) -> bool:
    if not blocking or wait_seconds is None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        return True
    ends_at = time.monotonic() + wait_seconds
    while True:  # flock has no timeout of its own
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= ends_at:
                log.warning("cache_lock_wait_ended", waited_seconds=round(wait_seconds, 1), action=WITHOUT_THE_CACHE)
                return False
            time.sleep(0.05)


def _mismatched(wanted: dict[str, str], paths: dict[str, Path]) -> list[str]:
    """The recorded files whose digest (at ``paths``) is not the recorded one, or that are missing."""
    return [
        relative for relative, digest in wanted.items()
        if relative not in paths or not paths[relative].is_file() or sha256_file(paths[relative]) != digest
    ]


def _write_extras(tree: Path, tracked: set[str], path: Path) -> None:
    """A tar of what the baseline does not track, so a checkout gives back the tree as extracted."""
    tracked_dirs = {str(Path(name).parent) for name in tracked}
    expanded = set()
    for directory in tracked_dirs:
        while directory not in ("", ".") and directory not in expanded:
            expanded.add(directory)
            directory = str(Path(directory).parent)
    with tarfile.open(path, mode="w:") as archive:
        for relative, entry in walk(tree, prune=lambda rel: rel == ".git"):
            if entry.is_dir(follow_symlinks=False):
                if relative not in expanded:
                    archive.add(entry.path, arcname=relative, recursive=False)
            elif relative not in tracked:
                archive.add(entry.path, arcname=relative, recursive=False)
