"""Shared fixtures: the fake codex, job roots, the Docker gate, the stub image, the leak check.

One named skip condition for Docker (``DOCKER_UNAVAILABLE``): without an
engine the ``docker`` tests skip with that reason, except under ``CI=true``,
where they fail instead, since a skipped integration suite in CI is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from runner.settings import REFERENCE_ENV

REPO = Path(__file__).resolve().parents[1]
FAKE_CODEX = REPO / "tests" / "fake_codex" / "codex"
STUB_CONTEXT = REPO / "containers" / "stub"
# Per session, so that sessions sharing a daemon never remove each other's image.
SESSION = uuid.uuid4().hex[:8]
STUB_TAG = f"agentissue-runner-stub:pytest-{SESSION}"
LABEL_MANAGED = "io.agentissue-runner.managed"
LABEL_SESSION = "io.agentissue-runner.session"
# Every runner container the tests make (in process or through the CLI) carries this session's
# label, and the leak check and the tests' sweeps touch only those: never a real run's beside them.
TEST_SESSION = f"pytest-{SESSION}"
os.environ["RUNNER_SESSION"] = TEST_SESSION

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
# The runner's journals (its own record of each job root) go to a directory of this session.
STATE_DIR = Path(tempfile.mkdtemp(prefix=f"runner-state-{SESSION}-"))
os.environ["RUNNER_STATE_DIR"] = str(STATE_DIR)
# The extraction cache is on by default for operators. Here it is off unless a test is about it
# (tests/integration/test_extraction_cache.py turns it on): the other tests assert on a real
# extraction from the image, and a cache filled by an earlier test would answer for it.
os.environ["RUNNER_CACHE_MAX_GB"] = "0"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(STATE_DIR, ignore_errors=True)


def _running(pid: int | str) -> bool:
    """Alive and not a zombie (the runner's own /proc reader)."""
    from runner.containment.run_owner import stat_fields

    fields = stat_fields(pid)
    return bool(fields) and fields[0] != "Z"


def processes_in(tree: Path) -> list[int]:
    """Live processes whose working directory is ``tree`` or below it: the agent's, in a test."""
    found = []
    prefix = str(tree.resolve())
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if not _running(entry):
            continue
        if cwd == prefix or cwd.startswith(prefix + "/"):
            found.append(int(entry))
    return found


def _docker_problem() -> str | None:
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
        client.close()
    except Exception as e:  # any failure to reach an engine means: no Docker here
        return f"no Docker Engine answers ({type(e).__name__}); start one with scripts/docker-up.sh"
    return None


DOCKER_UNAVAILABLE = _docker_problem()
IN_CI = os.environ.get("CI", "").lower() == "true"


# The fleet's tests need a real Redis (no mock broker, no fakeredis); .ci/run starts one.
REDIS_URL = os.environ.get("RUNNER_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def _redis_problem() -> str | None:
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3, socket_timeout=3)
        client.ping()
        client.close()
    except Exception as e:  # any failure to reach the server means: no Redis here
        return f"no Redis answers at RUNNER_TEST_REDIS_URL ({type(e).__name__}); start redis-server or set the variable"
    return None


REDIS_UNAVAILABLE = _redis_problem()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if IN_CI:
        return
    for marker, problem in (("docker", DOCKER_UNAVAILABLE), ("redis", REDIS_UNAVAILABLE)):
        if problem is None:
            continue
        skip = pytest.mark.skip(reason=problem)
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def redis_namespace() -> Iterator[tuple[str, str]]:
    """(broker URL, a key namespace of this test's own); every key under it is removed afterwards."""
    if REDIS_UNAVAILABLE is not None:
        pytest.fail(f"CI=true and the fleet tests cannot run: {REDIS_UNAVAILABLE}")
    import redis

    namespace = f"runner-test-{uuid.uuid4().hex[:10]}"
    yield REDIS_URL, namespace
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{namespace}:*"))
        if keys:
            client.delete(*keys)
        assert not list(client.scan_iter(match=f"{namespace}:*")), "Redis keys of the test are left behind"
    finally:
        client.close()


@pytest.fixture(scope="session")
def docker_client():
    if DOCKER_UNAVAILABLE is not None:
        pytest.fail(f"CI=true and the integration suite cannot run: {DOCKER_UNAVAILABLE}")
    import docker

    client = docker.from_env()
    yield client
    client.close()


def base_image(client) -> str:
    """The image the stub is built on: $STUB_BASE_IMAGE, else runner-base:bookworm when here, else Debian's slim."""
    wanted = os.environ.get("STUB_BASE_IMAGE")
    if wanted:
        return wanted
    try:
        client.images.get("runner-base:bookworm")
        return "runner-base:bookworm"
    except Exception:
        return "debian:bookworm-slim"


@pytest.fixture(scope="session")
def stub_image(docker_client) -> Iterator[str]:
    """The stub task image, built once per session with testcontainers' DockerImage."""
    from testcontainers.core.image import DockerImage

    # clean_up=False: DockerImage removes by id, which would also drop other tags of the
    # same id (such as the :latest a developer built); the tag alone is removed below.
    image = DockerImage(
        path=STUB_CONTEXT, tag=STUB_TAG, clean_up=False, buildargs={"BASE_IMAGE": base_image(docker_client)}
    )
    image.build()
    yield STUB_TAG
    try:
        docker_client.images.remove(STUB_TAG)  # and its untagged build layers no other image uses
    except Exception:
        pass  # still used by a container of another session, or already gone


def runner_containers(client) -> list:
    """Runner containers of this test session only: not a real run's, nor another session's."""
    labels = [f"{LABEL_MANAGED}=true", f"{LABEL_SESSION}={TEST_SESSION}"]
    return client.containers.list(all=True, filters={"label": labels}, ignore_removed=True)


@pytest.fixture
def no_leaked_containers(docker_client) -> Iterator[None]:
    """Fails the test that leaves a container with the runner's labels behind (and removes it)."""
    before = {c.id for c in runner_containers(docker_client)}
    yield
    leaked = [c for c in runner_containers(docker_client) if c.id not in before]
    for container in leaked:
        container.remove(force=True)
    assert not leaked, f"{len(leaked)} runner container(s) left behind: {[c.name for c in leaked]}"


@contextmanager
def mounted_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real file system of its own at ``path`` (a tmpfs of ``size``, e.g. ``"2m"``), unmounted after:
    a disk that fills up, or a jobs disk mounted apart from the state dir. Needs root: without it the
    test skips, and under CI=true it fails (as the Docker tests do)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        problem = f"cannot mount a tmpfs here ({done.stderr.decode().strip()}); needs root"
        pytest.fail(problem) if IN_CI else pytest.skip(problem)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill_up(disk: Path, name: str = "ballast") -> Path:
    """Write zeros to ``disk/name`` until the file system refuses one more byte: a full disk."""
    import errno

    ballast = disk / name
    chunk = b"\0" * 65536
    with open(ballast, "wb", buffering=0) as out:
        while True:
            try:
                out.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return ballast
                chunk = chunk[: len(chunk) // 2]


def make_job_root(tmp_path: Path, prompt: str = "Fix calc.add.\nfake-codex-mode: fix\n") -> Path:
    job = tmp_path / "job"
    (job / "context").mkdir(parents=True)
    (job / "context" / "prompt.md").write_text(prompt)
    return job


@pytest.fixture
def job_root(tmp_path: Path) -> Path:
    return make_job_root(tmp_path)


def cli_environment(extra: dict[str, str] | None) -> dict[str, str]:
    """This process's environment without the reference's variables, plus the test's own."""
    return {**{k: v for k, v in os.environ.items() if k not in RUNNER_ENV_NAMES}, **(extra or {})}


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m runner`` as an operator runs it: a real process, real exit code."""
    return subprocess.run(
        [sys.executable, "-m", "runner", *args],
        cwd=REPO,
        env=cli_environment(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# The reference's variables, kept out of the tests' children unless a test sets them.
RUNNER_ENV_NAMES = REFERENCE_ENV


def stub_args(job: Path, image: str, *extra: str, codex: Path = FAKE_CODEX) -> list[str]:
    return ["--job-root", str(job), "--tag", "stub_calc", "--image", image, "--codex-bin", str(codex), *extra]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def log_events(stderr: str | list[str], event: str) -> list[dict]:
    """The structured log events named ``event`` a runner process wrote to its stderr, parsed.

    For a real process; in-process code is asserted on with ``structlog.testing.capture_logs``.
    A substring check would also pass on the name inside another event's text.
    """
    lines = stderr.splitlines() if isinstance(stderr, str) else stderr
    found = []
    for line in lines:
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict) and parsed.get("event") == event:
            found.append(parsed)
    return found


HOSTILE_CONTEXT = REPO / "containers" / "hostile"
HOSTILE_TAG = f"agentissue-runner-hostile:pytest-{SESSION}"


@pytest.fixture(scope="session")
def hostile_image(docker_client, stub_image: str) -> Iterator[str]:
    """The crafted image (containers/hostile) on top of the stub: hostile trees and a big one."""
    from testcontainers.core.image import DockerImage

    DockerImage(path=HOSTILE_CONTEXT, tag=HOSTILE_TAG, clean_up=False, buildargs={"BASE_IMAGE": stub_image}).build()
    yield HOSTILE_TAG
    try:
        docker_client.images.remove(HOSTILE_TAG)
    except Exception:
        pass


@dataclass
class CompactRun:
    """A finished ``--execute``: its exit code, job root and stderr, and its two compact files."""

    exit_code: int
    job: Path
    stderr: str

    @property
    def run(self) -> dict:
        return read_json(self.job / "benchmark_run.compact.json")

    @property
    def result(self) -> dict:
        return read_json(self.job / "benchmark_result.compact.json")


class RunningCli:
    """``python -m runner`` in the background, its stderr events collected as they come."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        import threading

        self.process = subprocess.Popen(
            [sys.executable, "-m", "runner", *args], cwd=REPO, env=cli_environment(env),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)

    def wait_for_file(self, path: Path, timeout: float = 60) -> None:
        import time

        deadline = time.monotonic() + timeout
        while not path.exists() and time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        assert path.exists(), f"{path.name} never appeared; stderr so far: {''.join(self.lines)[-2000:]}"

    def wait_for(self, event: str, *, phase: str | None = None, timeout: float = 120) -> None:
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if f'"event": "{event}"' in line and (phase is None or f'"phase": "{phase}"' in line):
                    return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no {event} event (phase {phase}); stderr so far: {''.join(self.lines)[-2000:]}")

    def finish(self, timeout: float = 120) -> tuple[int, str, str]:
        self.process.wait(timeout=timeout)
        assert self.process.stdout is not None
        stdout = self.process.stdout.read()  # a small report: it cannot fill the pipe first
        self._reader.join(timeout=10)
        return self.process.returncode, stdout, "".join(self.lines)


def agent_gone(tree: Path, seconds: float = 10) -> bool:
    """Has every process working in ``tree`` ended within ``seconds``? (An agent in a PID
    namespace of its own writes pids that mean nothing outside it, so its pids are not used.)"""
    import time

    deadline = time.monotonic() + seconds
    while processes_in(tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not processes_in(tree)


def snapshot_outside(tmp_path: Path, *jobs: Path) -> dict[str, float]:
    """Every path under tmp_path but outside the given job roots, with its mtime (no recursion limit)."""
    from runner.trees import walk

    skipped = {str(job.resolve()) for job in jobs}
    return {
        relative: entry.stat(follow_symlinks=False).st_mtime
        for relative, entry in walk(tmp_path, prune=lambda relative: str(tmp_path.resolve() / relative) in skipped)
    }


def hanging_git_dir(tmp_path: Path) -> Path:
    """A directory holding a ``git`` to put first on PATH: ``git add`` runs the real one and then
    hangs (a child that never ends, as a git on a hung disk); every other command is the real git."""
    real = shutil.which("git")
    assert real is not None
    directory = tmp_path / "hanging-git"
    directory.mkdir()
    script = directory / "git"
    script.write_text(
        "#!/bin/sh\n"
        'for arg in "$@"; do\n'
        f'  if [ "$arg" = add ]; then "{real}" "$@"; sleep 600; exit 0; fi\n'
        "done\n"
        f'exec "{real}" "$@"\n'
    )
    script.chmod(0o755)
    return directory


def git_processes_of(job: Path) -> list[int]:
    """Live git processes working on ``job``'s baseline (found by their GIT_DIR)."""
    wanted = f"GIT_DIR={job.resolve() / '.baseline.git'}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if wanted not in environ.read().split(b"\0"):
                    continue
        except OSError:
            continue
        if not _running(entry):
            continue
        found.append(int(entry))
    return found


def remove_deep_chain(top: Path, name: str = "d") -> None:
    """Remove a chain ``top/d/d/d/...`` of any depth (deeper than a path can name) with short
    paths only: each level is lifted up beside ``top`` before the one above it is removed."""
    from runner.trees import remove_tree

    parent = top.parent
    while top.exists():
        lifted = parent / f".{top.name}.lifted"
        if (top / name).is_dir() and not (top / name).is_symlink():
            os.rename(top / name, lifted)
        remove_tree(top)
        if lifted.exists():
            os.rename(lifted, top)


def wait_dead(pid: int, seconds: float = 10) -> bool:
    """Has ``pid`` ended (a zombie counts as ended) within ``seconds``?"""
    import time

    def alive() -> bool:
        return _running(pid)

    deadline = time.monotonic() + seconds
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive()


VARIANTS_CONTEXT = REPO / "containers" / "variants"
# Build arguments a variant needs beside VARIANT (containers/variants/Dockerfile).
VARIANT_BUILD_ARGS = {"non_root": {"VARIANT_USER": "nobody"}}


@pytest.fixture(scope="session")
def variant_image(docker_client, stub_image: str) -> Iterator:
    """A builder of stub variants (containers/variants), each built once per session FROM the stub."""
    from testcontainers.core.image import DockerImage

    built: dict[str, str] = {}

    def build(variant: str) -> str:
        if variant not in built:
            tag = f"agentissue-runner-variant:{variant}-pytest-{SESSION}"
            DockerImage(path=VARIANTS_CONTEXT, tag=tag, clean_up=False,
                        buildargs={"BASE_IMAGE": stub_image, "VARIANT": variant,
                                   **VARIANT_BUILD_ARGS.get(variant, {})}).build()
            built[variant] = tag
        return built[variant]

    yield build
    for tag in built.values():
        try:
            docker_client.images.remove(tag)  # with the build's own untagged layers
        except Exception:
            pass


@pytest.fixture
def canary_base(docker_client) -> Iterator[str]:
    """The base the canary builds on; the canary's stub images made during the test are removed after."""
    before = {tag for image in docker_client.images.list("agentissue-runner-stub") for tag in image.tags}
    yield base_image(docker_client)
    for image in docker_client.images.list("agentissue-runner-stub"):
        for tag in set(image.tags) - before:
            if ":canary-" in tag:
                docker_client.images.remove(tag, noprune=False)


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A directory another user can traverse (pytest's own temp root is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="runner-agent-user-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# The fleet's fixture (workers on a real Redis), for every test file that runs a fleet; imported last,
# since tests.fleet_support takes its helpers from this module.
from tests.fleet_support import fleet  # noqa: E402,F401
from tests.registry_support import registry  # noqa: E402,F401
from tests.engine_support import second_engine  # noqa: E402,F401
