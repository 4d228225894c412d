"""Every Docker call the runner makes, through the Docker SDK (never the docker CLI).

Invariants:
- every container is created by ``managed_container`` and carries the runner's
  labels, and is removed (forced) when the block ends, also when creation or
  the block fails half-way; only ``NotFound`` is suppressed on removal;
- deadlines are enforced through the SDK (``kill``), never by trusting the container;
- exit codes come from the daemon (``exec_inspect``), never from files in the container.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import docker
import structlog
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.containers import Container
from docker.models.images import Image

from runner.errors import DockerUnavailableError, EnvironmentNotReadyError, ImageMissingError

log = structlog.get_logger(__name__)

LABEL_NAMESPACE = "io.agentissue-runner"
LABEL_MANAGED = f"{LABEL_NAMESPACE}.managed"
LABEL_JOB = f"{LABEL_NAMESPACE}.job-id"
LABEL_RUN = f"{LABEL_NAMESPACE}.run-id"
LABEL_PHASE = f"{LABEL_NAMESPACE}.phase"
ARCHIVE_CHUNK = 1024 * 1024


def runner_labels(*, job_id: str, run_id: str, phase: str) -> dict[str, str]:
    return {LABEL_MANAGED: "true", LABEL_JOB: job_id, LABEL_RUN: run_id, LABEL_PHASE: phase}


def connect(timeout: int = 30) -> docker.DockerClient:
    """A client whose daemon has answered a ping.

    Raises:
        DockerUnavailableError: no daemon at DOCKER_HOST (or the default socket).
    """
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except DockerException as e:
        raise DockerUnavailableError(type(e).__name__) from e
    return client


def ensure_image(client: docker.DockerClient, image: str, *, allow_pull: bool) -> Image:
    """The local image, pulled only when the operator allowed it.

    Raises:
        ImageMissingError: absent locally and pulling not allowed.
        EnvironmentNotReadyError: the pull itself failed.
    """
    try:
        return client.images.get(image)
    except ImageNotFound:
        if not allow_pull:
            raise ImageMissingError(image) from None
    log.info("image_pull_started", image=image)
    try:
        return client.images.pull(image)
    except DockerException as e:
        raise EnvironmentNotReadyError(
            f"pulling {image} failed ({type(e).__name__}); check the registry and the image name",
            reason="image_pull_failed",
        ) from e


def image_identity(image: Image) -> tuple[str, str | None]:
    """(image id, first repo digest or None): what the run actually used."""
    digests = image.attrs.get("RepoDigests") or []
    return image.id, (digests[0] if digests else None)


def _remove(container: Container) -> None:
    try:
        container.remove(force=True, v=True)
    except NotFound:
        pass


def remove_labelled(client: docker.DockerClient, labels: dict[str, str]) -> int:
    """Remove every container (running or not) carrying all ``labels``; returns how many."""
    filters = {"label": [f"{key}={value}" for key, value in labels.items()]}
    found = client.containers.list(all=True, filters=filters)
    for container in found:
        _remove(container)
    return len(found)


@contextmanager
def managed_container(
    client: docker.DockerClient, *, image: str, labels: dict[str, str], **create: Any
) -> Iterator[Container]:
    """Create a labelled container (not started) and always remove it."""
    container: Container | None = None
    try:
        container = client.containers.create(image, labels=labels, **create)
        yield container
    finally:
        if container is not None:
            _remove(container)
        else:
            # Creation failed or was interrupted half-way: the daemon may still hold it.
            remove_labelled(client, labels)


class _ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks, holding one chunk at a time."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size


def archive_stream(container: Container, path: str) -> IO[bytes]:
    """The tar stream of ``path`` in the container, read chunk by chunk, never held whole."""
    chunks, _stat = container.get_archive(path, chunk_size=ARCHIVE_CHUNK)
    return io.BufferedReader(_ChunkReader(iter(chunks)), buffer_size=ARCHIVE_CHUNK)


@dataclass(frozen=True)
class ExecOutcome:
    exit_code: int | None
    timed_out: bool
    output_bytes: int


def run_exec(
    container: Container, argv: list[str], *, deadline: float, log_path: Path
) -> ExecOutcome:
    """Run ``argv`` in a running container, output to ``log_path``, killed at ``deadline``.

    ``deadline`` is a ``time.monotonic()`` instant; on expiry the whole container is
    killed, which ends the command and anything it started.
    """
    api = container.client.api
    exec_id = api.exec_create(container.id, argv, stdout=True, stderr=True)["Id"]
    stream = api.exec_start(exec_id, stream=True)
    written = 0

    def pump() -> None:
        nonlocal written
        with log_path.open("ab") as sink:
            try:
                for chunk in stream:
                    sink.write(chunk)
                    written += len(chunk)
            except (DockerException, OSError, ValueError):
                pass  # the stream ends abruptly when the container is killed at the deadline

    pumper = threading.Thread(target=pump, name="exec-output", daemon=True)
    pumper.start()
    timed_out = False
    while True:
        info = api.exec_inspect(exec_id)
        if not info.get("Running"):
            break
        if time.monotonic() >= deadline:
            timed_out = True
            try:
                container.kill()
            except (NotFound, APIError):
                pass  # already gone: nothing left to stop
            break
        time.sleep(0.1)
    pumper.join(timeout=10)
    exit_code = None if timed_out else api.exec_inspect(exec_id).get("ExitCode")
    return ExecOutcome(exit_code=exit_code, timed_out=timed_out, output_bytes=written)
