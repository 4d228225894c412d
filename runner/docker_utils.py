"""Every Docker call the runner makes, through the Docker SDK (never the docker CLI).

Invariants:
- every container is created by ``managed_container`` and carries the runner's
  labels, and is removed (forced) when the block ends, also when creation or
  the block fails half-way; only ``NotFound`` is suppressed on removal;
- deadlines are enforced through the SDK (``kill``), never by trusting the container;
- exit codes come from the daemon (``wait``), never from files in the container.
"""

from __future__ import annotations

import io
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import structlog
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.containers import Container
from docker.models.images import Image
from docker.types import LogConfig
from docker.utils.socket import demux_adaptor, frames_iter
from requests.exceptions import ConnectionError as RequestsConnectionError
from requests.exceptions import RequestException
from urllib3.exceptions import ProtocolError

from runner.errors import DockerUnavailableError, ImageMissingError
from runner.containment import signals
from runner.containment.run_owner import Owner, current_owner

log = structlog.get_logger(__name__)

# Containers whose output the runner reads through an attach as they run (or needs no output
# of, as the network probe): a log driver would only keep a second, capped copy on the daemon's disk.
NO_LOG_DRIVER = LogConfig(type=LogConfig.types.NONE)

LABEL_NAMESPACE = "io.agentissue-runner"
LABEL_MANAGED = f"{LABEL_NAMESPACE}.managed"
LABEL_JOB = f"{LABEL_NAMESPACE}.job-id"
LABEL_RUN = f"{LABEL_NAMESPACE}.run-id"
LABEL_PHASE = f"{LABEL_NAMESPACE}.phase"
LABEL_HOST = f"{LABEL_NAMESPACE}.host"
LABEL_BOOT = f"{LABEL_NAMESPACE}.boot-id"
LABEL_PIDNS = f"{LABEL_NAMESPACE}.pid-namespace"
LABEL_PID = f"{LABEL_NAMESPACE}.pid"
LABEL_PID_START = f"{LABEL_NAMESPACE}.pid-start"
# An operator's (or a test session's) own label: its containers carry it, and a sweep run
# with the same variable touches only containers that carry it.
LABEL_SESSION = f"{LABEL_NAMESPACE}.session"
SESSION_ENV = "RUNNER_SESSION"
_SAFE_SESSION = re.compile(r"[A-Za-z0-9_.-]{1,64}")
ARCHIVE_CHUNK = 1024 * 1024


def runner_labels(*, job_id: str, run_id: str, phase: str) -> dict[str, str]:
    """The labels every runner container carries; the owner's let a sweep tell live runs from dead."""
    owner = current_owner()
    return {
        **session_label(),
        LABEL_MANAGED: "true",
        LABEL_JOB: job_id,
        LABEL_RUN: run_id,
        LABEL_PHASE: phase,
        LABEL_HOST: socket.gethostname(),
        LABEL_BOOT: owner.boot_id,
        LABEL_PIDNS: owner.pid_namespace,
        LABEL_PID: str(owner.pid),
        LABEL_PID_START: owner.start_ticks,
    }


def session_label() -> dict[str, str]:
    """``{LABEL_SESSION: $RUNNER_SESSION}`` when that variable holds a plain label, else nothing."""
    session = os.environ.get(SESSION_ENV, "")
    return {LABEL_SESSION: session} if _SAFE_SESSION.fullmatch(session) else {}


def owner_of(labels: dict[str, str]) -> Owner | None:
    pid = labels.get(LABEL_PID, "")
    if not pid.isdigit():
        return None
    return Owner(
        boot_id=labels.get(LABEL_BOOT, ""),
        pid_namespace=labels.get(LABEL_PIDNS, ""),
        pid=int(pid),
        start_ticks=labels.get(LABEL_PID_START, ""),
    )


def daemon_gone(error: BaseException) -> bool:
    """Did this error come from losing the daemon (stopped, crashed, socket gone) mid-call?

    docker-py lets the transport's errors through (``requests.ConnectionError``, which is an
    ``OSError``, or urllib3's ``ProtocolError`` from a broken stream); looked for along the
    chain of causes, so a wrapped one is found too. A read timeout is not one of them.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (RequestsConnectionError, ProtocolError, ConnectionError)):
            return "timed out" not in str(current).lower()
        current = current.__cause__ or current.__context__
    return False


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


def image_present(client: docker.DockerClient, image: str) -> bool:
    try:
        client.images.get(image)
    except ImageNotFound:
        return False
    return True


def build_image(client: docker.DockerClient, context: str, *, tag: str, buildargs: dict[str, str],
                labels: dict[str, str]) -> None:
    """Build from a local context with a local base only (never pulls), removing intermediate containers.

    Raises:
        docker.errors.BuildError: the build failed (its log names why); DockerException: the daemon did.
    """
    client.images.build(path=context, tag=tag, buildargs=buildargs, rm=True, forcerm=True, pull=False, labels=labels)


def data_root(client: docker.DockerClient) -> str:
    """Where the daemon keeps images and containers (its DockerRootDir), as it reports it."""
    return str(client.info().get("DockerRootDir") or "")


def image_identity(image: Image) -> tuple[str, str | None]:
    """(image id, first repo digest or None): what the run actually used."""
    digests = image.attrs.get("RepoDigests") or []
    return image.id, (digests[0] if digests else None)


def _remove(container: Container) -> None:
    try:
        container.remove(force=True, v=True)
    except NotFound:
        pass


def _labelled(client: docker.DockerClient, labels: dict[str, str]) -> list[Container]:
    """docker-py inspects each listed container: one removed meanwhile (another run's cleanup, the
    daemon finishing a removal) is skipped, not a 404 that ends the sweep or a worker's start."""
    filters = {"label": [f"{key}={value}" for key, value in labels.items()]}
    return client.containers.list(all=True, filters=filters, ignore_removed=True)


def remove_labelled(client: docker.DockerClient, labels: dict[str, str]) -> int:
    """Remove every container (running or not) carrying all ``labels``; returns how many."""
    found = _labelled(client, labels)
    for container in found:
        _remove(container)
    return len(found)


def sweep_strays(client: docker.DockerClient, *, job_id: str | None = None) -> tuple[int, int]:
    """Remove runner containers whose run is dead; returns (removed, kept).

    With ``job_id``, a container of that job is a stray unless its owner is a live
    process here (the caller holds the job root's lock, but a copied job root could
    carry the same id: never take a live run's container). Without it, a container
    is a stray only when its owner ran in this boot and this pid namespace and is
    gone; containers of other sandboxes on the same daemon are kept. With
    ``RUNNER_SESSION`` set, only containers of that session are looked at.
    """
    labels = {LABEL_MANAGED: "true", **({LABEL_JOB: job_id} if job_id else {}), **session_label()}
    here = current_owner()
    removed = kept = 0
    for container in _labelled(client, labels):
        owner = owner_of(container.labels or {})
        alive_here = owner is not None and owner.same_place(here) and owner.alive()
        if job_id is not None:
            dead = not alive_here
        else:
            dead = owner is not None and owner.same_place(here) and not owner.alive()
        if dead:
            _remove(container)
            removed += 1
        else:
            kept += 1
    return removed, kept


@contextmanager
def managed_container(
    client: docker.DockerClient, *, image: str, labels: dict[str, str], **create: Any
) -> Iterator[Container]:
    """Create a labelled container (not started) and always remove it.

    Raises:
        ImageMissingError: the image is not present locally (nothing is pulled here).
    """
    container: Container | None = None
    try:
        try:
            with signals.deferred():  # an interrupt mid-request would leave the daemon a container no one owns
                container = client.containers.create(image, labels=labels, **create)
        except ImageNotFound:
            raise ImageMissingError(image) from None
        yield container
    finally:
        if container is not None:
            _remove(container)
        else:
            # Creation failed or was interrupted half-way: the daemon may still hold it.
            remove_labelled(client, labels)


class _ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks, holding one chunk at a time.

    Closing it closes the HTTP response under the chunks: while a ``get_archive``
    response is open the daemon keeps the container busy, and a forced removal
    would wait for the stream (seen: a 30 s timeout after an interrupt).
    ``on_chunk`` runs before each chunk is taken (a deadline's check).
    """

    def __init__(self, chunks: Generator[bytes, None, None], response: Any, on_chunk: Callable[[], None]) -> None:
        self._chunks = chunks
        self._buffer = b""
        self._response = response
        self._on_chunk = on_chunk

    def readable(self) -> bool:
        return True

    def abort(self) -> None:
        """From another thread: shut the response's socket down, so that a read blocked in it
        returns at once (closing the file would wait for the read's lock, and closing a socket
        another thread is reading does not wake that read on Linux)."""
        sock = _socket_of(self._response)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            self._on_chunk()
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size

    def close(self) -> None:
        if not self.closed:
            self._chunks.close()
            if self._response is not None:
                self._response.close()
        super().close()


def _socket_of(response: Any) -> socket.socket | None:
    """The socket under a requests response (urllib3's response, http.client's, its socket file)."""
    raw = getattr(response, "raw", None)
    fp = getattr(getattr(getattr(raw, "_fp", None), "fp", None), "raw", None)
    sock = getattr(fp, "_sock", None)
    if sock is None:
        sock = getattr(getattr(raw, "_connection", None), "sock", None)
    return sock if isinstance(sock, socket.socket) else None


class ArchiveStream(io.BufferedReader):
    """The buffered tar stream of ``get_archive``; ``abort()`` ends it from another thread."""

    def abort(self) -> None:
        raw = self.raw
        if isinstance(raw, _ChunkReader):
            raw.abort()


# Go's os.ModeSymlink, in the mode of the daemon's path stat.
_GO_MODE_SYMLINK = 1 << 27


def is_symlink_stat(stat: dict[str, Any]) -> bool:
    return bool(stat.get("linkTarget")) or bool(int(stat.get("mode", 0) or 0) & _GO_MODE_SYMLINK)


def archive_stream_with_stat(
    container: Container, path: str, *, on_chunk: Callable[[], None] = lambda: None
) -> tuple[ArchiveStream, dict[str, Any]]:
    """The tar stream of ``path`` in the container, read chunk by chunk, never held whole, and the
    daemon's stat of ``path`` (``name``, ``mode``, ``linkTarget``). ``on_chunk`` runs before each
    chunk is read (what it raises ends the read).

    Raises:
        NotFound: ``path`` does not exist in the container.
    """
    chunks, stat = container.get_archive(path, chunk_size=ARCHIVE_CHUNK)
    # docker-py keeps the streaming response in its generator's frame (an argument, there before
    # the first chunk) and offers no handle to it; take it from there so that closing the stream
    # closes the socket, and aborting it wakes a read of the very first chunk too (docker-py
    # turns the socket's timeout off for a stream: a stalled daemon would be waited for for ever).
    frame = getattr(chunks, "gi_frame", None)
    response = frame.f_locals.get("response") if frame is not None else None
    reader = _ChunkReader(chunks, response, on_chunk)
    return ArchiveStream(reader, buffer_size=ARCHIVE_CHUNK), dict(stat or {})


@dataclass(frozen=True)
class ProcessOutcome:
    exit_code: int | None
    timed_out: bool
    started: float = 0.0  # time.monotonic() just before the start: its output may come before start() returns
    finished: float = 0.0  # time.monotonic() when the wait ended


def copy_in(container: Container, directory: str, archive: bytes) -> None:
    """Put a tar archive into a created container (before its start): nothing of the host is mounted."""
    container.put_archive(directory, archive)


def start_and_wait(container: Container, *, timeout: float) -> int:
    """Start the container and return its exit code, waiting at most ``timeout`` seconds.

    Raises:
        requests' ReadTimeout: it ran longer (``managed_container`` removes it).
    """
    container.start()
    return int(container.wait(timeout=timeout).get("StatusCode", 255))


def run_main_process(
    container: Container, *, timeout: float, on_start: Callable[[], None] = lambda: None
) -> ProcessOutcome:
    """Start the container and wait for its own process, killed when ``timeout`` seconds have passed."""
    started = time.monotonic()
    container.start()
    on_start()
    ended = wait_main_process(container, deadline=started + timeout)
    return ProcessOutcome(ended.exit_code, ended.timed_out, started=started, finished=time.monotonic())


def wait_main_process(container: Container, *, deadline: float) -> ProcessOutcome:
    """Wait for the container's own process; its exit code comes from the daemon; killed at ``deadline``."""
    try:
        status = container.wait(timeout=max(1.0, deadline - time.monotonic()))
    except RequestException as e:  # the wait timed out: the deadline passed (or the daemon went)
        if daemon_gone(e) and time.monotonic() < deadline:
            raise DockerUnavailableError(f"lost during the wait: {type(e).__name__}") from e
        try:
            container.kill()
        except NotFound:
            pass  # gone already: nothing to kill, and no exit code to read
        except APIError:  # not running: it ended on its own just as the deadline passed
            state = container.client.api.inspect_container(container.id).get("State", {})
            if not state.get("Running"):
                return ProcessOutcome(exit_code=int(state.get("ExitCode", -1)), timed_out=False)
        return ProcessOutcome(exit_code=None, timed_out=True)
    return ProcessOutcome(exit_code=int(status.get("StatusCode", -1)), timed_out=False)


def stdin_attach_supported(client: docker.DockerClient) -> bool:
    """Can this client half-close a container's standard input (``docker run -i``'s way)?

    Over a unix socket or plain TCP, yes. Over TLS, ssh or a named pipe docker-py's attach socket
    cannot be half-closed reliably, so callers put files in with ``copy_in`` there instead.
    """
    base = str(getattr(client.api, "base_url", ""))
    return base.startswith("http+docker://localhost") or base.startswith("http://")


def _feed_stdin(raw: socket.socket, data: bytes | Path) -> None:
    """Write ``data`` to the container's stdin, then half-close it (the container reads EOF).

    An error means the container ended or was killed first: its own check of what it received
    (or the deadline) decides what that means, so nothing is raised here.
    """
    try:
        if isinstance(data, bytes):
            raw.sendall(data)
        else:
            with data.open("rb") as handle:
                for chunk in iter(lambda: handle.read(ARCHIVE_CHUNK), b""):
                    raw.sendall(chunk)
        raw.shutdown(socket.SHUT_WR)
    except OSError:
        pass


@contextmanager
def pumping_output(
    container: Container, sink: Callable[[Any], None], *, demux: bool = False, stdin: bytes | Path | None = None
) -> Iterator[None]:
    """Attach to a container before it starts and hand all its output to ``sink``, from a thread.

    Read while the container runs, the output never depends on a log driver that could
    cap, rotate or drop it. On a normal exit of the block the thread is joined (the
    stream ends with the container) and an error of ``sink`` is raised here; on an error
    in the block the stream is closed first. With ``demux`` (a container without a TTY)
    ``sink`` gets ``(stdout bytes or None, stderr bytes or None)`` pairs: the two streams
    stay apart, as the official verdict reads stdout alone.

    ``stdin`` (bytes or a file; the container made with ``stdin_open``): sent on the same
    attach from another thread, then half-closed, as ``docker run -i`` does: a file reaches
    the container with no ``put_archive`` (which Engine 20.10 serves by starting a process of
    its own). Only where ``stdin_attach_supported``.
    """
    if stdin is None:
        stream = container.attach(stdout=True, stderr=True, stream=True, logs=False, demux=demux)
        close: Callable[[], None] = stream.close
        abort = close
        writer = None
    else:
        attached = container.client.api.attach_socket(
            container.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        raw: socket.socket = getattr(attached, "_sock", attached)
        raw.settimeout(None)  # a test may be silent for longer than the client's timeout
        frames = frames_iter(attached, False)
        stream = (demux_adaptor(*frame) for frame in frames) if demux else (data for _kind, data in frames)

        def close() -> None:
            attached.close()
            raw.close()

        def abort() -> None:
            try:
                raw.shutdown(socket.SHUT_RDWR)  # wakes the reader, ends the writer
            except OSError:
                pass
            close()

        writer = threading.Thread(target=_feed_stdin, args=(raw, stdin), name="container-stdin", daemon=True)
        writer.start()
    sink_failures: list[Exception] = []

    def pump() -> None:
        try:
            for chunk in stream:
                if sink_failures:
                    continue  # keep draining, so that the container never blocks on a full pipe
                try:
                    sink(chunk)
                except Exception as e:  # a full disk, say: raised in the caller's thread below
                    sink_failures.append(e)
        except (DockerException, RequestException, OSError, ValueError):
            pass  # the stream ends abruptly when the container is killed or removed

    thread = threading.Thread(target=pump, name="container-output", daemon=True)
    thread.start()
    try:
        yield
    except BaseException:
        abort()
        thread.join(timeout=10)
        raise
    thread.join(timeout=60)
    if writer is not None:
        writer.join(timeout=10)
    close()
    if sink_failures:
        raise sink_failures[0]


# -- images: the primitives runner.images composes (pins, pulls, eviction) -------------------


def local_image(client: docker.DockerClient, ref: str) -> Image | None:
    """The local image ``ref`` names (a name, name@digest or an id), or None."""
    try:
        return client.images.get(ref)
    except ImageNotFound:
        return None


def registry_digest(client: docker.DockerClient, name: str) -> str:
    """The digest the registry serves for ``name`` now: the daemon asks it (distribution API), no pull.

    Raises: docker.errors.APIError (the registry refused or cannot be reached), KeyError/TypeError (no digest).
    """
    return str(client.api.inspect_distribution(name)["Descriptor"]["digest"])


@contextmanager
def pull_stream(repository: str, tag: str | None, *, read_timeout: float) -> Iterator[Iterator[dict]]:
    """The daemon's pull progress events, on a client of its own whose socket read times out after
    ``read_timeout`` (requests' ReadTimeout): a pull that says nothing that long has stalled."""
    api = _PullClient(read_timeout=max(1.0, read_timeout), **docker.utils.kwargs_from_env())
    try:
        yield api.pull(repository, tag=tag, stream=True, decode=True)
    finally:
        api.close()


class _PullClient(docker.APIClient):
    """docker-py's pull posts with ``timeout=None`` (a stream may take hours): this client gives that
    request a read deadline instead, so a pull that goes quiet raises rather than waits for ever."""

    def __init__(self, *, read_timeout: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._read_timeout = read_timeout

    def _post(self, url: str, **kwargs: Any) -> Any:
        if url.endswith("/images/create") and kwargs.get("timeout", 0) is None:
            kwargs["timeout"] = self._read_timeout
        return super()._post(url, **kwargs)


def remove_image(client: docker.DockerClient, image_id: str) -> None:
    """Remove one image (never forced: one a container uses stays, APIError 409).

    Raises: ImageNotFound (already gone), docker.errors.APIError (in use, or the daemon refused).
    """
    client.images.remove(image_id, force=False, noprune=False)


def image_own_bytes(client: docker.DockerClient) -> dict[str, int]:
    """Each image's own bytes on disk (``docker system df``: its size less the layers it shares with
    another image). Raises: DockerException."""
    own = {}
    for image in client.df().get("Images") or []:
        size, shared = int(image.get("Size") or 0), int(image.get("SharedSize") or 0)
        own[str(image.get("Id"))] = max(size - max(shared, 0), 0)
    return own
