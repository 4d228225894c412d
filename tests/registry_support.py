"""A real registry on loopback for the pull tests: Debian's ``docker-registry`` (the distribution
registry), plain HTTP on 127.0.0.1 (an engine treats 127.0.0.0/8 as an insecure registry by
default, so no engine configuration is needed), with synthetic task images pushed to it.

No test may depend on a public registry: every pull a test makes is from one of these.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import free_port

REGISTRY_BINARY = os.environ.get("RUNNER_TEST_REGISTRY_BIN", "docker-registry")
LABEL_TEST_IMAGE = "io.agentissue-runner.test-image"


class Registry:
    """One registry process with its own storage; ``stop``/``start`` take it away and bring it back."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.config = directory / "config.yml"
        self.config.write_text(
            "version: 0.1\n"
            "log:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {directory / 'storage'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n"
        )
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._process = subprocess.Popen([REGISTRY_BINARY, "serve", str(self.config)], stdout=subprocess.DEVNULL,
                                         stderr=open(self.directory / "registry.log", "ab"))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1):
                    return
            except OSError:
                if self._process.poll() is not None:
                    break
                time.sleep(0.1)
        raise RuntimeError(f"the registry did not start: {(self.directory / 'registry.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def repository(self, name: str = "agentissue-bench") -> str:
        return f"{self.host}/{name}"


def start_registry(directory: Path) -> Registry:
    """A started registry storing under ``directory`` (skipped without the binary; under CI=true, failed)."""
    if shutil.which(REGISTRY_BINARY) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and the registry binary {REGISTRY_BINARY!r} is missing: .ci/run installs "
                        "Debian's docker-registry")
        pytest.skip(f"no {REGISTRY_BINARY} on this machine (apt-get install docker-registry)")
    directory.mkdir(parents=True, exist_ok=True)
    running = Registry(directory)
    running.start()
    return running


@pytest.fixture
def registry(tmp_path: Path, docker_client) -> Iterator[Registry]:
    """A registry of the test's own; at teardown every image pulled from it or pushed to it goes from
    the engine, and the test fails if one stays."""
    running = start_registry(tmp_path / "registry")
    try:
        yield running
    finally:
        running.stop()
        assert_none_left(docker_client, running)


def _context(base: str, megabytes: int, salt: str) -> io.BytesIO:
    """A build context: the stub image plus one layer of ``megabytes`` of random bytes (its own content)."""
    dockerfile = (f"FROM {base}\n"
                  f"RUN head -c {megabytes * 1024 * 1024} /dev/urandom > /opt/bulk-{salt} && echo {salt} > /opt/variant\n")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def push_variant(docker_client, registry: Registry, base: str, tag: str, megabytes: int,
                 repository: str = "agentissue-bench") -> str:
    """Build a variant of ``base`` with its own bulk layer, push it as ``<registry>/<repository>:<tag>``,
    and remove it locally (so a task must pull it). The pushed repo digest (sha256:...)."""
    name = f"{registry.repository(repository)}:{tag}"
    salt = uuid.uuid4().hex[:12]
    docker_client.images.build(fileobj=_context(base, megabytes, salt), custom_context=True, tag=name, rm=True,
                               forcerm=True, pull=False, labels={LABEL_TEST_IMAGE: "true"})
    digest = None
    for event in docker_client.api.push(name, stream=True, decode=True):
        if "error" in event:
            raise RuntimeError(f"push of {name} failed: {event['error']}")
        digest = (event.get("aux") or {}).get("Digest") or digest
    assert digest, f"the push of {name} reported no digest"
    docker_client.images.remove(name, force=True)
    return digest


def local_images(docker_client, repository: str) -> list:
    return [image for image in docker_client.images.list() if any(t.startswith(repository + ":") or
            t.startswith(repository + "@") for t in image.tags + (image.attrs.get("RepoDigests") or []))]


def remove_local(docker_client, repository: str) -> None:
    """Remove every local image named ``repository`` (by tag or by repo digest: one pulled by digest
    has no tag)."""
    for image in local_images(docker_client, repository):
        try:
            docker_client.images.remove(image.id, force=True)
        except Exception:
            pass


def images_from(docker_client, registry: Registry) -> list:
    """Local images pulled from ``registry`` or built to be pushed to it (any repository of it)."""
    prefix = registry.host + "/"
    return [image for image in docker_client.images.list()
            if any(name.startswith(prefix) for name in image.tags + (image.attrs.get("RepoDigests") or []))]


def assert_none_left(docker_client, registry: Registry) -> None:
    """Remove what ``registry``'s images left on the engine, then fail if any stayed: a test's pulls
    and pushes (untagged, once the registry's port is gone) must not pile up on the engine."""
    for image in images_from(docker_client, registry):
        try:
            docker_client.images.remove(image.id, force=True)
        except Exception:
            pass
    left = [image.attrs.get("RepoDigests") or image.tags for image in images_from(docker_client, registry)]
    assert not left, f"images of the test's registry {registry.host} are left on the engine: {left}"


class StallingRegistry:
    """A registry front that answers the API from ``upstream`` but, for any blob, sends its headers and
    then nothing: a pull that starts and then says nothing, as over a network that went quiet."""

    def __init__(self, upstream: Registry) -> None:
        import http.server
        import threading

        self.released = threading.Event()
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def _answer(self, body: bool) -> None:
                if "/blobs/" in self.path:
                    self.send_response(200)
                    self.send_header("Content-Length", str(10 * 1024 * 1024))
                    self.send_header("Content-Type", "application/octet-stream")
                    self.end_headers()
                    front.released.wait(120)
                    return
                request = urllib.request.Request(f"http://{upstream.host}{self.path}", method=self.command,
                                                 headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
                try:
                    answer = urllib.request.urlopen(request, timeout=10)
                except urllib.error.HTTPError as error:
                    answer = error
                data = answer.read()
                self.send_response(answer.status if hasattr(answer, "status") else answer.code)
                for key, value in answer.headers.items():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._answer(True)

            def do_HEAD(self) -> None:  # noqa: N802
                self._answer(False)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.host = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()
