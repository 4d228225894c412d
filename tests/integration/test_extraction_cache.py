"""The extraction cache against a real Docker Engine: one extraction per image, shared by nothing writable."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.docker_utils import LABEL_PHASE, LABEL_SESSION
from runner.jobroot import JobRoot
from runner.trees import walk
from tests.conftest import (
    TEST_SESSION,
    fill_up,
    log_events,
    make_job_root,
    mounted_tmpfs,
    read_json,
    run_cli,
    stub_args,
)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]


NO_CHANGE = "Fix calc.add.\nfake-codex-mode: no-change\n"


def _cache_env(cache: Path, max_gb: str = "1") -> dict[str, str]:
    return {"RUNNER_CACHE_DIR": str(cache), "RUNNER_CACHE_MAX_GB": max_gb}


@pytest.fixture(params=["jobs-beside-the-cache", "jobs-on-a-disk-of-their-own"])
def jobs_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """Where the job roots go: on the cache's file system, or on one of their own (a real tmpfs),
    as on a server whose jobs disk (/srv) is mounted apart from the state dir (/var/lib)."""
    if request.param == "jobs-beside-the-cache":
        yield tmp_path / "jobs"
        return
    with mounted_tmpfs(tmp_path / "jobs-disk", "64m") as disk:
        assert disk.stat().st_dev != tmp_path.stat().st_dev
        yield disk


def _resolved(job: Path) -> bool:
    return read_json(job / "benchmark_run.compact.json")["official_task_score"]["resolved"] is True


def _from_cache(job: Path) -> bool:
    return read_json(job / "result-markers" / "extract.json")["details"]["from_cache"]


def _tree_digest(tree: Path) -> dict[str, str]:
    """Every entry of an extracted tree but the agent's .git: content and mode."""
    out = {}
    for relative, entry in walk(tree, prune=lambda rel: rel == ".git"):
        info = entry.stat(follow_symlinks=False)
        if entry.is_symlink():
            out[relative] = "link:" + os.readlink(entry.path)
        elif entry.is_file(follow_symlinks=False):
            out[relative] = f"{info.st_mode & 0o777:o}:" + hashlib.sha256(Path(entry.path).read_bytes()).hexdigest()
        else:
            out[relative] = "dir"
    return out


def _cache_digest(cache: Path) -> dict[str, str]:
    return {
        rel: hashlib.sha256(Path(entry.path).read_bytes()).hexdigest() if entry.is_file(follow_symlinks=False) else "dir"
        for rel, entry in walk(cache)
        if not rel.endswith(".lock")
    }


def _baseline_tree(job: Path) -> str:
    commit = read_json(job / "result-markers" / "baseline.json")["details"]["baseline_commit"]
    git_dir = JobRoot.at(job, "stub_calc").baseline_git_dir
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", "rev-parse", f"{commit}^{{tree}}"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _now() -> float:
    """The next whole second: Docker's event filter counts whole seconds, so nothing earlier can match."""
    time.sleep(1 - time.time() % 1 + 0.01)
    return time.time()


def _extract_creates(docker_client, since: float) -> int:
    """Extract containers this test session created since ``since`` (a ``_now()``; Docker's own event log)."""
    events = docker_client.events(
        since=int(since), until=int(time.time()) + 1, decode=True,
        filters={"type": "container", "event": "create",
                 "label": [f"{LABEL_PHASE}=extract", f"{LABEL_SESSION}={TEST_SESSION}"]},
    )
    return sum(1 for _ in events)


def test_second_attempt_takes_the_cached_tree_without_docker(tmp_path: Path, stub_image: str, docker_client) -> None:
    cache = tmp_path / "cache"
    first, second = make_job_root(tmp_path / "a"), make_job_root(tmp_path / "b", "Fix calc.add.\nfake-codex-mode: no-change\n")
    started = _now()
    done = run_cli("--execute", *stub_args(first, stub_image), env=_cache_env(cache))
    assert done.returncode == 0, done.stderr
    assert _extract_creates(docker_client, started) == 1
    first_tree = read_json(first / "result-markers" / "extract.json")
    assert first_tree["details"]["from_cache"] is False
    assert read_json(first / "benchmark_run.compact.json")["source_from_cache"] is False

    between = _now()
    done = run_cli("--execute", *stub_args(second, stub_image), env=_cache_env(cache))
    assert done.returncode == 1, done.stderr  # no-change: the empty patch fails; what matters is the tree
    assert _extract_creates(docker_client, between) == 0  # no container: the tree came from the cache
    marker = read_json(second / "result-markers" / "extract.json")
    assert marker["details"]["from_cache"] is True
    assert marker["details"]["file_count"] == first_tree["details"]["file_count"]
    assert marker["details"]["image_id"] == first_tree["details"]["image_id"]
    run = read_json(second / "benchmark_run.compact.json")
    assert run["source_from_cache"] is True and run["first_failed_phase"] == "patch"
    # The same tree as a fresh extraction, and the same baseline commit.
    fresh = make_job_root(tmp_path / "c", "Fix calc.add.\nfake-codex-mode: no-change\n")
    run_cli("--execute", *stub_args(fresh, stub_image), env={"RUNNER_CACHE_MAX_GB": "0"})
    assert read_json(fresh / "result-markers" / "extract.json")["details"]["from_cache"] is False
    assert _baseline_tree(second) == _baseline_tree(fresh)  # commits differ by their time, never by content
    assert _tree_digest(second / "buggy-source") == _tree_digest(fresh / "buggy-source")
    listed = run_cli("--cache", "list", env=_cache_env(cache))
    assert listed.returncode == 0, listed.stderr
    assert str(tmp_path) not in listed.stdout


def test_an_agent_that_poisons_its_tree_and_git_cannot_reach_the_next_attempt(tmp_path: Path, stub_image: str) -> None:
    cache = tmp_path / "cache"
    fill = make_job_root(tmp_path / "fill", "Fix calc.add.\nfake-codex-mode: no-change\n")
    run_cli("--execute", *stub_args(fill, stub_image), env=_cache_env(cache))
    pristine = _tree_digest(fill / "buggy-source")
    stored = _cache_digest(cache)
    assert stored, "the first attempt filled the cache"

    hostile = make_job_root(tmp_path / "hostile", "Fix calc.add.\nfake-codex-mode: poison-cache\n")
    done = run_cli("--execute", *stub_args(hostile, stub_image), env=_cache_env(cache))
    assert read_json(hostile / "result-markers" / "extract.json")["details"]["from_cache"] is True
    assert (hostile / "buggy-source" / "poison.txt").exists()  # the agent did write its own tree
    assert _cache_digest(cache) == stored  # same user as the runner here: still nothing of the cache shared

    after = make_job_root(tmp_path / "after", "Fix calc.add.\nfake-codex-mode: no-change\n")
    done = run_cli("--execute", *stub_args(after, stub_image), env=_cache_env(cache))
    assert read_json(after / "result-markers" / "extract.json")["details"]["from_cache"] is True, done.stderr
    assert _tree_digest(after / "buggy-source") == pristine
    assert _cache_digest(cache) == stored


def test_an_agent_user_cannot_reach_the_cache(stub_image: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("--agent-user needs the runner to run as root")
    base = Path(tempfile.mkdtemp(prefix="runner-cache-agent-"))
    try:
        base.chmod(0o711)
        cache = base / "cache"
        fill = make_job_root(base / "fill", "Fix calc.add.\nfake-codex-mode: no-change\n")
        for path in (base / "fill", fill):
            path.chmod(0o711)
        run_cli("--execute", *stub_args(fill, stub_image), env=_cache_env(cache))
        stored = _cache_digest(cache)
        assert stored and (cache.stat().st_mode & 0o777) == 0o700

        job = make_job_root(base / "hostile", f"Fix calc.add.\nfake-codex-mode: poison-cache\nfake-codex-cache-dir: {cache}\n")
        for path in (base / "hostile", job):
            path.chmod(0o711)
        done = run_cli("--execute", *stub_args(job, stub_image, "--agent-user", "nobody"), env=_cache_env(cache))
        assert read_json(job / "result-markers" / "extract.json")["details"]["from_cache"] is True, done.stderr
        assert (job / "buggy-source" / "poison.txt").exists()
        assert _cache_digest(cache) == stored and not (cache / "planted-by-agent").exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_corrupted_entry_is_discarded_and_extracted_again(
    tmp_path: Path, jobs_dir: Path, stub_image: str, docker_client
) -> None:
    cache = tmp_path / "cache"
    first = make_job_root(jobs_dir / "a", NO_CHANGE)
    run_cli("--execute", *stub_args(first, stub_image), env=_cache_env(cache))
    (pack,) = cache.glob("*/baseline.git/objects/pack/pack-*.pack")
    pack.write_bytes(pack.read_bytes()[:-40] + b"\0" * 40)

    started = _now()
    second = make_job_root(jobs_dir / "b")
    done = run_cli("--execute", *stub_args(second, stub_image), env=_cache_env(cache))
    assert done.returncode == 0, done.stderr
    (discarded,) = log_events(done.stderr, "cache_entry_discarded")
    assert discarded["level"] == "warning" and discarded["reason"]
    assert read_json(second / "result-markers" / "extract.json")["details"]["from_cache"] is False
    assert _extract_creates(docker_client, started) == 1
    assert read_json(second / "benchmark_run.compact.json")["official_task_score"]["resolved"] is True
    (fresh_pack,) = cache.glob("*/baseline.git/objects/pack/pack-*.pack")
    assert fresh_pack.read_bytes()[-40:] != b"\0" * 40  # the entry was filled again


def test_two_first_attempts_extract_once_and_both_resolve(
    tmp_path: Path, jobs_dir: Path, stub_image: str, docker_client
) -> None:
    cache = tmp_path / "cache"
    jobs = [make_job_root(jobs_dir / name) for name in ("a", "b")]
    started = _now()
    results = {}

    def run(job: Path) -> None:
        results[job] = run_cli("--execute", *stub_args(job, stub_image), env=_cache_env(cache))

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert _extract_creates(docker_client, started) == 1
    sources = sorted(read_json(job / "result-markers" / "extract.json")["details"]["from_cache"] for job in jobs)
    assert sources == [False, True], [results[job].stderr[-2000:] for job in jobs]
    assert [results[job].returncode for job in jobs] == [0, 0], [results[job].stderr[-2000:] for job in jobs]
    assert all(_resolved(job) for job in jobs)
    assert _tree_digest(jobs[0] / "buggy-source") == _tree_digest(jobs[1] / "buggy-source")


def test_cache_off_extracts_every_time(tmp_path: Path, stub_image: str, docker_client) -> None:
    cache = tmp_path / "cache"
    started = _now()
    for name in ("a", "b"):
        job = make_job_root(tmp_path / name, "Fix calc.add.\nfake-codex-mode: no-change\n")
        run_cli("--execute", *stub_args(job, stub_image, "--cache-max-gb", "0", "--cache-dir", str(cache)))
        assert read_json(job / "result-markers" / "extract.json")["details"]["from_cache"] is False
    assert _extract_creates(docker_client, started) == 2
    assert not cache.exists()


# --- the ordinary server layout, an agent in the cache, a full cache disk ------------------------

def test_the_default_cache_serves_job_roots_on_a_disk_of_their_own(tmp_path: Path, stub_image: str, docker_client) -> None:
    """The cache in the state dir (its default place) on one file system, the job roots on another:
    git cannot rename a pack across them, so the cache stages on its own file system."""
    state = tmp_path / "state"
    env = {"RUNNER_STATE_DIR": str(state), "RUNNER_CACHE_MAX_GB": "1"}
    with mounted_tmpfs(tmp_path / "jobs-disk", "64m") as disk:
        assert disk.stat().st_dev != tmp_path.stat().st_dev
        first, second = make_job_root(disk / "a"), make_job_root(disk / "b")
        started = _now()
        done = run_cli("--execute", *stub_args(first, stub_image), env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert _resolved(first) and not _from_cache(first)
        assert len(log_events(done.stderr, "cache_entry_stored")) == 1
        assert list((state / "extract-cache").glob("*/entry.json")), "the default cache, in the state dir, was filled"

        between = _now()
        done = run_cli("--execute", *stub_args(second, stub_image), env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert _resolved(second) and _from_cache(second)
        assert read_json(second / "benchmark_run.compact.json")["source_from_cache"] is True
        assert _extract_creates(docker_client, between) == 0
        assert _extract_creates(docker_client, started) == 1
        assert _tree_digest(first / "buggy-source").keys() == _tree_digest(second / "buggy-source").keys()


def test_an_agent_writing_into_the_cache_dir_changes_only_its_own_attempt(
    tmp_path: Path, jobs_dir: Path, stub_image: str
) -> None:
    """Run as the runner's own user and outside any sandbox (the fake codex has none), the agent
    overwrites every file of the cache: the next attempt finds the entry bad, extracts again and
    gets the pristine tree and baseline."""
    cache = tmp_path / "cache"
    fill = make_job_root(jobs_dir / "fill", NO_CHANGE)
    run_cli("--execute", *stub_args(fill, stub_image), env=_cache_env(cache))
    pristine, baseline = _tree_digest(fill / "buggy-source"), _baseline_tree(fill)
    stored = _cache_digest(cache)
    assert stored, "the first attempt filled the cache"

    hostile = make_job_root(jobs_dir / "hostile", f"Fix calc.add.\nfake-codex-mode: poison-cache\nfake-codex-cache-dir: {cache}\n")
    done = run_cli("--execute", *stub_args(hostile, stub_image), env=_cache_env(cache))
    assert _from_cache(hostile), done.stderr[-3000:]
    assert (cache / "planted-by-agent").exists() and _cache_digest(cache) != stored  # it did write the cache

    after = make_job_root(jobs_dir / "after", NO_CHANGE)
    done = run_cli("--execute", *stub_args(after, stub_image), env=_cache_env(cache))
    (discarded,) = log_events(done.stderr, "cache_entry_discarded")
    assert discarded["level"] == "warning"
    assert not _from_cache(after)
    assert _tree_digest(after / "buggy-source") == pristine and _baseline_tree(after) == baseline

    last = make_job_root(jobs_dir / "last")  # the entry was filled anew, and serves a fix that resolves
    done = run_cli("--execute", *stub_args(last, stub_image), env=_cache_env(cache))
    assert done.returncode == 0, done.stderr[-3000:]
    assert _from_cache(last) and _resolved(last)


def test_a_cache_on_a_full_disk_falls_back_to_a_plain_extraction(tmp_path: Path, stub_image: str) -> None:
    with mounted_tmpfs(tmp_path / "cache-disk", "1m") as disk:
        cache = disk / "cache"
        cache.mkdir(mode=0o700)  # the cache was there; then its disk filled up
        fill_up(disk)
        for name in ("a", "b"):
            job = make_job_root(tmp_path / name)
            done = run_cli("--execute", *stub_args(job, stub_image), env=_cache_env(cache))
            assert done.returncode == 0, done.stderr[-3000:]
            assert _resolved(job) and not _from_cache(job)
            (failed,) = log_events(done.stderr, "cache_fill_failed")
            assert failed["level"] == "warning" and failed["reason"] == "OSError: ENOSPC", failed
            assert failed["free_bytes"] < 65536 and "--cache-dir" in failed["action"]
            assert str(tmp_path) not in json.dumps(failed)
            assert read_json(job / "benchmark_run.compact.json")["source_from_cache"] is False
            assert not [p.name for p in cache.iterdir() if not p.name.endswith(".lock")]  # no half-made entry
