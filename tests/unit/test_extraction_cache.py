"""The extraction cache on its own (no Docker): round trip, checks, LRU bound, locks, the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from git import GitCommandError
from structlog.testing import capture_logs

from runner.errors import CacheEntryError
from runner.extraction_cache import ExtractionCache, TreeStats, cache_key
from runner.jobroot import JobRoot
from runner.phases.baseline import build_baseline
from runner.trees import walk
from tests.conftest import REPO, cli_environment, fill_up, mounted_tmpfs

STATS = TreeStats(files=0, directories=0, symlinks=0, bytes=0, oracle_entries_skipped=0)


def _job(tmp_path: Path, name: str, files: int = 3, size: int = 10) -> JobRoot:
    job = JobRoot.at(tmp_path / name, "t")
    tree = job.buggy_source
    (tree / "pkg" / "empty").mkdir(parents=True)
    (tree / ".gitignore").write_text("*.log\nbuild/\n")
    (tree / "debug.log").write_text("ignored but extracted\n")
    (tree / "build").mkdir()
    (tree / "build" / "out.bin").write_bytes(b"\x00\x01")
    for i in range(files):
        (tree / "pkg" / f"m{i}.py").write_bytes(os.urandom(size))
    (tree / "run.sh").write_text("#!/bin/sh\n")
    (tree / "run.sh").chmod(0o755)
    (tree / "link").symlink_to("pkg/m0.py")
    return job


def _digest(tree: Path) -> dict[str, str]:
    out = {}
    for rel, entry in walk(tree, prune=lambda r: r == ".git"):
        if entry.is_symlink():
            out[rel] = "->" + os.readlink(entry.path)
        elif entry.is_file(follow_symlinks=False):
            out[rel] = f"{entry.stat().st_mode & 0o777:o}:{Path(entry.path).read_bytes().hex()}"
        else:
            out[rel] = "dir"
    return out


def _fill(cache: ExtractionCache, job: JobRoot, key: str) -> str:
    commit = build_baseline(job)
    cache.store(key, image_id="sha256:" + key, image_digest=None, source_dir="/app/src",
                baseline_git_dir=job.baseline_git_dir, tree=job.buggy_source, stats=STATS)
    return commit


def test_a_checkout_gives_back_the_tree_as_extracted(tmp_path: Path) -> None:
    cache = ExtractionCache(tmp_path / "cache", max_bytes=10**9)
    source = _job(tmp_path, "first")
    commit = _fill(cache, source, "k1")
    assert (cache.root.stat().st_mode & 0o777) == 0o700
    record = cache.lookup("k1")
    assert record is not None and record.baseline_commit == commit
    target = JobRoot.at(tmp_path / "second", "t")
    target.root.mkdir()
    cache.checkout("k1", record, baseline_git_dir=target.baseline_git_dir, tree=target.buggy_source)
    assert _digest(target.buggy_source) == _digest(source.buggy_source)
    assert "pkg/empty" in _digest(target.buggy_source) and "debug.log" in _digest(target.buggy_source)
    assert build_baseline(target) == commit  # the checkout's baseline is taken as it is
    # Nothing of the cache is shared: no alternates, and its pack is a copy (another inode).
    assert not (target.baseline_git_dir / "objects" / "info" / "alternates").exists()
    ours = {p.name: p.stat().st_ino for p in (target.baseline_git_dir / "objects" / "pack").iterdir()}
    theirs = {p.name: p.stat().st_ino for p in (cache.root / "k1" / "baseline.git" / "objects" / "pack").iterdir()}
    assert ours.keys() == theirs.keys() and not set(ours.values()) & set(theirs.values())
    assert str(tmp_path) not in (cache.root / "k1" / "baseline.git" / "config").read_text()


def test_an_entry_whose_branch_moved_or_file_changed_is_discarded(tmp_path: Path) -> None:
    cache = ExtractionCache(tmp_path / "cache", max_bytes=10**9)
    _fill(cache, _job(tmp_path, "a"), "k1")
    git_dir = cache.root / "k1" / "baseline.git"
    other = subprocess.run(
        ["git", f"--git-dir={git_dir}", "commit-tree", "-m", "forged", "HEAD^{tree}"],
        capture_output=True, text=True, check=True, env={**os.environ, "GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@x",
                                                         "GIT_COMMITTER_NAME": "x", "GIT_COMMITTER_EMAIL": "x@x"},
    ).stdout.strip()
    subprocess.run(["git", f"--git-dir={git_dir}", "update-ref", "refs/heads/main", other], check=True)
    subprocess.run(["git", f"--git-dir={git_dir}", "update-ref", "HEAD", other], check=True)
    assert cache.lookup("k1") is None and not (cache.root / "k1").exists()

    _fill(cache, _job(tmp_path, "b"), "k2")
    (pack,) = (cache.root / "k2" / "baseline.git" / "objects" / "pack").glob("*.pack")
    data = bytearray(pack.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in a stored (uncompressed) object
    pack.write_bytes(bytes(data))
    record = cache.lookup("k2")
    assert record is not None  # the digests are checked as the entry is checked out
    target = JobRoot.at(tmp_path / "c", "t")
    target.root.mkdir()
    with pytest.raises(CacheEntryError):  # git's own checksum or the recorded digest, whichever sees it first
        cache.checkout("k2", record, baseline_git_dir=target.baseline_git_dir, tree=target.buggy_source)

    _fill(cache, _job(tmp_path, "d"), "k3")
    extras = cache.root / "k3" / "extras.tar"
    extras.write_bytes(extras.read_bytes().replace(b"ignored but extracted", b"IGNORED BUT EXTRACTED"))
    record = cache.lookup("k3")
    target = JobRoot.at(tmp_path / "e", "t")
    target.root.mkdir()
    with pytest.raises(CacheEntryError, match="extras.tar is not what was stored"):
        cache.checkout("k3", record, baseline_git_dir=target.baseline_git_dir, tree=target.buggy_source)
    assert not (target.buggy_source / "debug.log").exists()  # nothing of a bad entry is placed
    assert not target.baseline_git_dir.exists()  # nor a baseline holding its commit, which would pass for the job's


def test_any_file_of_an_entry_overwritten_is_found_or_never_read(tmp_path: Path) -> None:
    """Each file of an entry in turn overwritten (as an agent that reached the cache would): the
    entry is discarded, or refused at checkout, or the file is one a checkout never reads; never
    another exception (a damaged HEAD or config once escaped as GitPython's own errors)."""
    cache = ExtractionCache(tmp_path / "cache", max_bytes=10**9)

    def files(key: str) -> list[str]:  # the same names in every entry but the pack's, which sorts alike
        return sorted(rel for rel, entry in walk(cache.root / key) if entry.is_file(follow_symlinks=False))

    _fill(cache, _job(tmp_path, "probe"), "probe")
    outcomes: dict[str, str] = {}
    for i in range(len(files("probe"))):
        key, source = f"k{i}", _job(tmp_path, f"s{i}")
        _fill(cache, source, key)
        relative = files(key)[i]
        (cache.root / key / relative).write_bytes(b"poison")
        name = re.sub(r"pack-[0-9a-f]{40}", "pack-*", relative)
        with capture_logs() as logs:
            record = cache.lookup(key)
        if record is None:
            assert [e["log_level"] for e in logs if e["event"] == "cache_entry_discarded"] == ["warning"], name
            outcomes[name] = "discarded"
            continue
        target = JobRoot.at(tmp_path / f"t{i}", "t")
        target.root.mkdir()
        try:
            cache.checkout(key, record, baseline_git_dir=target.baseline_git_dir, tree=target.buggy_source)
        except CacheEntryError:
            assert not target.buggy_source.exists() and not target.baseline_git_dir.exists(), name
            outcomes[name] = "refused"
            continue
        assert _digest(target.buggy_source) == _digest(source.buggy_source), name
        outcomes[name] = "not read"
    for name in ("entry.json", "baseline.git/HEAD", "baseline.git/refs/heads/main"):
        assert outcomes[name] == "discarded", outcomes
    assert outcomes["extras.tar"] == "refused"  # its digest, checked beside the checkout
    for name in ("baseline.git/objects/pack/pack-*.pack", "baseline.git/objects/pack/pack-*.idx"):
        assert outcomes[name] in ("discarded", "refused"), outcomes  # git reads them to resolve the branch
    assert outcomes["baseline.git/config"] in ("discarded", "not read")  # git reads `poison` as a bad key; a checkout never


def test_a_cache_on_a_read_only_disk_is_a_warning_and_no_lock(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "disk", "1m") as disk:
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        cache = ExtractionCache(disk / "cache", max_bytes=10**9)
        with capture_logs() as logs, cache.locked("k") as held:
            assert held is False
    (event,) = [e for e in logs if e["event"] == "cache_unavailable"]
    assert event["log_level"] == "warning" and event["reason"] == "OSError: EROFS" and "--cache-dir" in event["action"]


def test_a_sound_entry_that_a_full_jobs_disk_cannot_take_stays(tmp_path: Path) -> None:
    cache = ExtractionCache(tmp_path / "cache", max_bytes=10**9)
    _fill(cache, _job(tmp_path, "a", files=3, size=200_000), "k")
    record = cache.lookup("k")
    assert record is not None
    with mounted_tmpfs(tmp_path / "jobs", "1m") as disk:
        target = JobRoot.at(disk / "job", "t")
        target.root.mkdir()
        fill_up(disk)
        with pytest.raises((OSError, GitCommandError)):  # the job's own error: not the entry's fault
            cache.checkout("k", record, baseline_git_dir=target.baseline_git_dir, tree=target.buggy_source)
        assert not target.buggy_source.exists() and not target.baseline_git_dir.exists()
    assert cache.lookup("k") is not None and [item.key for item in cache.entries()] == ["k"]


def test_least_recently_used_entries_go_first_and_locked_ones_stay(tmp_path: Path) -> None:
    cache = ExtractionCache(tmp_path / "cache", max_bytes=10**9)
    for i, name in enumerate(("old", "mid", "new")):
        _fill(cache, _job(tmp_path, name, files=5, size=20_000), name)
        os.utime(cache.root / name / "entry.json", (1000 + i, 1000 + i))
    cache.lookup("old")  # used now: it becomes the most recent
    sizes = {item.key: item.disk_bytes for item in cache.entries()}
    assert set(sizes) == {"old", "mid", "new"} and all(size > 100_000 for size in sizes.values())
    with cache.locked("mid"):  # an attempt is checking it out: it stays
        removed = cache.prune(max_bytes=sizes["old"] + sizes["mid"] + 1)
    assert removed == ["new"]  # mid was the least recent, but in use
    assert {item.key for item in cache.entries()} == {"old", "mid"}
    assert cache.prune(max_bytes=sizes["old"] + 1) == ["mid"]
    assert cache.prune(max_bytes=0) == ["old"] and cache.entries() == []


def test_the_lock_is_per_key(tmp_path: Path) -> None:
    cache = ExtractionCache(tmp_path / "cache", max_bytes=10**9)
    with cache.locked("a"):
        with cache.locked("a", blocking=False) as got_same, cache.locked("b", blocking=False) as got_other:
            assert got_same is False and got_other is True
    with cache.locked("a", blocking=False) as got:
        assert got is True


def test_cache_key_depends_on_image_and_source_dir() -> None:
    keys = {cache_key("sha256:a", "/app/x"), cache_key("sha256:a", "/app/y"), cache_key("sha256:b", "/app/x")}
    assert len(keys) == 3 and cache_key("sha256:a", "/app/x") == cache_key("sha256:a", "/app/x")


def _cli(*args: str, cache: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "runner", "--cache", *args, "--cache-dir", str(cache)],
                          cwd=REPO, env=cli_environment(None), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_cache_list_and_prune_from_the_cli(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    cache = ExtractionCache(cache_dir, max_bytes=10**9)
    for name in ("a" * 32, "b" * 32):
        _fill(cache, _job(tmp_path, name[:1], files=4, size=5000), name)
    os.utime(cache_dir / ("a" * 32) / "entry.json", (time.time() - 60,) * 2)
    listed = _cli("list", cache=cache_dir)
    assert listed["action"] == "list" and listed["entry_count"] == 2 and listed["removed"] == []
    assert listed["total_bytes"] == sum(item["disk_bytes"] for item in listed["entries"])
    assert str(tmp_path) not in json.dumps(listed)
    one = max(item["disk_bytes"] for item in listed["entries"])
    pruned = _cli("prune", "--cache-max-gb", str((one + 1) / 1024**3), cache=cache_dir)
    assert pruned["removed"] == ["a" * 32] and pruned["entry_count"] == 1
    assert [item["key"] for item in pruned["entries"]] == ["b" * 32]


def test_a_cache_dir_with_dots_is_refused(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "runner", "--cache", "list", "--cache-dir", f"{tmp_path}/../x"],
                          cwd=REPO, env=cli_environment(None), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "cache" in done.stderr.lower()
    with pytest.raises(SystemExit):
        from runner.cli import build_parser

        build_parser().parse_args(["--cache", "bogus"])


def test_a_large_baseline_starts_no_background_gc(tmp_path: Path) -> None:
    """Over 6,700 loose objects, `git commit` would fork a detached `gc --auto` that repacks beside the agent."""
    job = JobRoot.at(tmp_path / "big", "t")
    for i in range(7000):
        folder = job.buggy_source / f"d{i // 500}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i}.txt").write_text(f"{i}\n")
    build_baseline(job)
    time.sleep(1.0)
    assert not (job.baseline_git_dir / "gc.pid").exists() and not (job.baseline_git_dir / "gc.log").exists()
    assert not list((job.baseline_git_dir / "objects" / "pack").glob("*.pack"))
