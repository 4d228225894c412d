"""Task images at suite scale: pinned by digest, pulled with progress and a stall deadline, and the
ones the runner pulled itself evicted under a disk budget.

Invariants:
- a pin is taken once per batch or submit (``pin_image``) and every phase then uses it, so a
  push to the same tag while a suite runs changes nothing evaluated; a local image that no
  registry knows (built here) is pinned by its id;
- a pull reports progress (a rich bar on a terminal, throttled ``image_pull_progress`` events
  elsewhere) and fails when it reports nothing for ``timeout`` seconds; the registry's own
  words reach public output only through ``public_registry_message``;
- credentials are Docker's own (``~/.docker/config.json``, read by the SDK): never a flag, never logged;
- eviction removes only images this host's runner pulled (``PulledImages``, in the state dir), least
  recently used first, never one a task here still needs, never one that was on the host before;
- a prefetch pulls only when, after eviction, the runner's images and one more fit the budget
  (``room_for_one``), so the host holds at most the budget plus the one image a task is pulling.
"""

from __future__ import annotations

import fcntl
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import structlog
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.utils import parse_repository_tag
from pydantic import BaseModel, ConfigDict, ValidationError
from requests.exceptions import ConnectionError as RequestsConnectionError
from requests.exceptions import ReadTimeout
from urllib3.exceptions import ProtocolError, ReadTimeoutError

from runner.atomic import write_json_atomic
from runner.docker_utils import image_own_bytes, local_image, pull_stream, registry_digest, remove_image
from runner.bounded_read import UnreadableFileError, read_bounded_json
from runner.errors import EnvironmentNotReadyError, ImageMissingError, ImageUnknownError, RunnerError
from runner.journal import default_state_dir
from runner.settings import RunnerSettings

log = structlog.get_logger(__name__)

PROGRESS_EVERY_SECONDS = 5.0  # the log events' throttle (a terminal's bar redraws itself)
PULLED_RECORD = "images/pulled.json"
_RECORD_MAX_BYTES = 4 * 1024 * 1024
# What a registry (through the daemon) says when the name or tag does not exist or may not be had:
# the operator's to fix, never retried.
_UNKNOWN = re.compile(r"manifest unknown|not found|does not exist|repository name not known|pull access denied"
                      r"|unauthorized|invalid reference format|name unknown", re.IGNORECASE)
_HOST_PATH = re.compile(r"(?<![\w:/.-])/(?:[\w.@+-]+/)*[\w.@+-]+")
_CREDENTIALS = re.compile(r"//[^/@\s]+@")


def public_registry_message(text: str) -> str:
    """The registry's (or daemon's) message, fit for public output: one line, bounded, no host path,
    no credentials in a URL."""
    line = " ".join(str(text).split())[:240]
    return _HOST_PATH.sub("<path>", _CREDENTIALS.sub("//<credentials>@", line))


class ImagePullError(EnvironmentNotReadyError):
    """The pull failed or stalled: the host's or the registry's, so a fleet retries it."""

    reason = "image_pull_failed"

    def __init__(self, image: str, detail: str, *, reason: str = "image_pull_failed") -> None:
        super().__init__(f"pulling {image} failed: {public_registry_message(detail)}; check the registry "
                         "(and Docker's own login in ~/.docker/config.json), then run again", reason=reason)


@dataclass(frozen=True)
class PinnedImage:
    name: str  # as the task names it
    ref: str  # what every phase uses: repository@sha256:..., or the local image's id
    digest: str | None  # the repository digest (None: a local image pinned by id)


def _repository(name: str) -> str:
    repository, _ = parse_repository_tag(name)
    return repository


def _local_pin(image: Any, name: str) -> PinnedImage:
    repository = _repository(name)
    for entry in image.attrs.get("RepoDigests") or []:
        repo, _, digest = entry.partition("@")
        if repo == repository and digest:
            return PinnedImage(name=name, ref=entry, digest=digest)
    return PinnedImage(name=name, ref=image.id, digest=None)


def pin_image(client: docker.DockerClient, name: str, *, allow_pull: bool) -> PinnedImage:
    """The image ``name`` means now: the registry's digest where pulling is allowed (a lookup, no pull),
    else the local image's repo digest, else its id.

    Raises:
        ImageUnknownError: the registry does not know the name (and it is not here).
        ImagePullError: the registry cannot be asked (and the image is not here).
        ImageMissingError: not here, and pulling is not allowed.
    """
    if "@" in name or name.startswith("sha256:"):
        return PinnedImage(name=name, ref=name, digest=name.partition("@")[2] or None)
    local = local_image(client, name)
    if allow_pull:
        try:
            digest = registry_digest(client, name)
            return PinnedImage(name=name, ref=f"{_repository(name)}@{digest}", digest=digest)
        except (APIError, DockerException, KeyError, TypeError) as e:
            detail = getattr(e, "explanation", None) or str(e)
            if local is not None:  # built or loaded here, or the registry is away: the local one is what runs
                log.info("image_pinned_locally", image=name, why=public_registry_message(detail)[:120])
            elif _UNKNOWN.search(str(detail)) and "connection refused" not in str(detail).lower():
                raise ImageUnknownError(name, public_registry_message(detail)) from e
            else:
                raise ImagePullError(name, detail, reason="image_registry_unreachable") from e
    if local is None:
        raise ImageMissingError(name)
    return _local_pin(local, name)


def pin_names(client: docker.DockerClient, names: dict[str, str], *, allow_pull: bool) -> dict[str, PinnedImage]:
    """Each key's image name pinned once (a driver's tags, a submit's); one that cannot be pinned is
    left out and logged, and its task then fails in its own precheck with the same error, named."""
    pins: dict[str, PinnedImage] = {}
    by_name: dict[str, PinnedImage | None] = {}
    for key, name in names.items():
        if name not in by_name:
            try:
                by_name[name] = pin_image(client, name, allow_pull=allow_pull)
                log.info("image_pinned", image=name, ref=by_name[name].ref)
            except (EnvironmentNotReadyError, ImageUnknownError) as e:
                by_name[name] = None
                log.warning("image_not_pinned", image=name, reason=e.reason)
        if (pin := by_name[name]) is not None:
            pins[key] = pin
    return pins


@dataclass
class _Layers:
    """What the pull's stream said so far, per layer: bytes downloaded of bytes in total."""

    current: dict[str, int]
    total: dict[str, int]
    done: set[str]
    last_event: float = 0.0  # time.monotonic() of the stream's last event

    def take(self, event: dict[str, Any]) -> None:
        layer, status = event.get("id"), str(event.get("status", ""))
        if not layer or layer.startswith(("sha256:", "latest")) or " " in layer:
            return
        detail = event.get("progressDetail") or {}
        self.total.setdefault(layer, 0)
        if status == "Downloading" and isinstance(detail.get("total"), int):
            self.current[layer], self.total[layer] = int(detail.get("current") or 0), detail["total"]
        elif status in ("Pull complete", "Already exists", "Download complete"):
            self.done.add(layer)
            self.current[layer] = self.total[layer]

    @property
    def figures(self) -> dict[str, int]:
        return {"bytes_done": sum(self.current.values()), "bytes_total": sum(self.total.values()),
                "layers_done": len(self.done), "layers_total": len(self.total)}


class _Bar:
    """A rich bar on a terminal (bytes, layers); throttled log events elsewhere."""

    def __init__(self, image: str, terminal: bool) -> None:
        self._image, self._last = image, 0.0
        self._progress = self._task = None
        if terminal:
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

            self._progress = Progress(TextColumn("pull {task.fields[image]}"), BarColumn(), DownloadColumn(),
                                      TransferSpeedColumn(), TextColumn("{task.fields[layers]}"), transient=True)
            self._progress.start()
            self._task = self._progress.add_task("pull", total=None, image=image, layers="")

    def show(self, layers: _Layers, *, final: bool = False) -> None:
        figures = layers.figures
        if self._progress is not None:
            self._progress.update(self._task, completed=figures["bytes_done"], total=figures["bytes_total"] or None,
                                  layers=f"{figures['layers_done']}/{figures['layers_total']} layers")
            return
        now = time.monotonic()
        if final or now - self._last >= PROGRESS_EVERY_SECONDS:
            self._last = now
            log.info("image_pull_progress", image=self._image, **figures)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def _stalled(ref: str, timeout: float) -> ImagePullError:
    return ImagePullError(ref, f"no progress for {timeout:.0f} s (--pull-timeout)", reason="image_pull_stalled")


def _pull_failure(ref: str, detail: str) -> RunnerError:
    """What a failed pull is: a name the registry does not know is the operator's (never retried),
    unless it is a pinned digest, which was there when the suite started: then the registry lost it,
    an infrastructure failure naming the digest; anything else is the registry's or the network's."""
    if _UNKNOWN.search(detail) and "connection refused" not in detail.lower():
        if "@sha256:" in ref:
            return ImagePullError(ref, f"the pinned digest is no longer served ({detail})", reason="image_pin_unavailable")
        return ImageUnknownError(ref, public_registry_message(detail))
    return ImagePullError(ref, detail)


def pull_image(client: docker.DockerClient, ref: str, *, timeout: float) -> Any:
    """Pull ``ref`` through the SDK's streaming API, showing progress; the pulled image.

    ``timeout``: the stream's read deadline, so a pull that says nothing for that long fails.

    Raises:
        ImageUnknownError: the registry does not have it (or may not give it).
        ImagePullError: it failed, stalled, or the registry cannot be reached.
    """
    repository, tag = parse_repository_tag(ref)
    started = time.monotonic()
    layers = _Layers({}, {}, set(), started)
    bar = _Bar(ref, terminal=sys.stderr.isatty())
    log.info("image_pull_started", image=ref)
    try:
        with pull_stream(repository, tag, read_timeout=timeout) as events:
            for event in events:
                if "error" in event:
                    raise _pull_failure(ref, str(event.get("error")))
                layers.last_event = time.monotonic()
                layers.take(event)
                bar.show(layers)
        bar.show(layers, final=True)
    except (ReadTimeout, TimeoutError, ReadTimeoutError) as e:
        raise _stalled(ref, timeout) from e
    except (NotFound, APIError) as e:
        raise _pull_failure(ref, str(getattr(e, "explanation", None) or e)) from e
    except (RequestsConnectionError, ProtocolError, DockerException) as e:
        if time.monotonic() - layers.last_event >= timeout - 0.5:  # a read timeout, as urllib3 words it mid-stream
            raise _stalled(ref, timeout) from e
        raise ImagePullError(ref, type(e).__name__) from e
    finally:
        bar.close()
    image = local_image(client, ref)
    if image is None:
        raise ImagePullError(ref, "the daemon reported the pull done but has no such image")
    log.info("image_pull_finished", image=ref, seconds=round(time.monotonic() - started, 3),
             bytes=layers.figures["bytes_total"])
    return image


def ensure_image(client: docker.DockerClient, image: str, *, allow_pull: bool, pull_timeout: float,
                 state_dir: Path | None) -> Any:
    """The local image, pulled (with progress) only when the operator allowed it; a pull is recorded
    in ``state_dir`` as the runner's own (``PulledImages``), so eviction may later remove it.

    Raises:
        ImageMissingError: absent locally and pulling not allowed.
        ImageUnknownError, ImagePullError: the pull (``pull_image``).
    """
    found = local_image(client, image)
    if found is not None:
        if state_dir is not None:
            PulledImages(state_dir).used(found.id)  # only when the runner pulled it (else no lock, no write)
        return found
    if not allow_pull:
        raise ImageMissingError(image)
    pulled = pull_image(client, image, timeout=pull_timeout)
    if state_dir is not None:
        digest = image.partition("@")[2] or None
        PulledImages(state_dir).pulled(pulled, image, digest or _local_pin(pulled, image).digest)
    return pulled


def task_image(client: docker.DockerClient, settings: RunnerSettings) -> Any:
    """The task's image (``settings.resolved_image``: its pin, else its name), as every phase gets it."""
    return ensure_image(client, settings.resolved_image, allow_pull=settings.allow_pull,
                        pull_timeout=settings.pull_timeout, state_dir=settings.state_dir or default_state_dir())


# -- the images this runner pulled, and their eviction ---------------------------------------


class PulledImage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    image_id: str
    name: str
    digest: str | None
    size_bytes: int
    pulled_at: float
    last_used: float


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")

    images: dict[str, PulledImage]


@dataclass(frozen=True)
class PulledImages:
    """``<state dir>/images/pulled.json``: the images the runner pulled on this host (no paths, no secrets).

    A record that cannot be read counts as empty: eviction then removes nothing (never a guess).
    """

    state_dir: Path

    @property
    def path(self) -> Path:
        return self.state_dir / PULLED_RECORD

    @contextmanager
    def _locked(self) -> Iterator[dict[str, PulledImage]]:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            images = self._read()
            before = dict(images)
            yield images
            if images != before:
                write_json_atomic(self.path, _Record(images=images).model_dump(mode="json"))
        finally:
            os.close(fd)

    def _read(self) -> dict[str, PulledImage]:
        if not os.path.lexists(self.path):
            return {}
        try:
            return _Record.model_validate(read_bounded_json(self.path, root=self.path.parent,
                                                            max_bytes=_RECORD_MAX_BYTES, max_depth=8)).images
        except (UnreadableFileError, ValidationError):
            log.warning("pulled_images_record_unreadable")
            return {}

    def entries(self) -> list[PulledImage]:
        return sorted(self._read().values(), key=lambda entry: entry.last_used)

    def pulled(self, image: Any, name: str, digest: str | None) -> None:
        now = time.time()
        with self._locked() as images:
            images[image.id] = PulledImage(image_id=image.id, name=name, digest=digest,
                                           size_bytes=int(image.attrs.get("Size") or 0), pulled_at=now, last_used=now)

    def used(self, image_id: str) -> None:
        """Mark a pulled image used now; an image the runner did not pull is not its to track, so for one
        the record does not hold, nothing is locked or written (a lockless look, then the locked update)."""
        if image_id not in self._read():
            return
        with self._locked() as images:
            if image_id in images:
                images[image_id] = images[image_id].model_copy(update={"last_used": time.time()})

    def room_for_one(self, client: docker.DockerClient, budget_bytes: int, *, keep: Iterable[str] = ()) -> bool:
        """Make room for one more pull (a prefetch's) under ``budget_bytes``: evict (never ``keep``) until
        the rest plus the largest image pulled here so far fit; True when they do. So a prefetch keeps
        the budget itself, and a task's own pull beside it is the one image over it."""
        keep = set(keep)
        own = _own_bytes(client)
        estimate = max((own.get(e.image_id, e.size_bytes) for e in self._read().values()), default=0)
        self.evict(client, max(budget_bytes - estimate, 0), keep=keep)
        own = _own_bytes(client)
        return sum(own.get(e.image_id, e.size_bytes) for e in self._read().values()) + estimate <= budget_bytes

    def evict(self, client: docker.DockerClient, budget_bytes: int, *, keep: Iterable[str] = ()) -> list[PulledImage]:
        """Remove least recently used pulled images until the rest fit in ``budget_bytes``; never one in
        ``keep`` (refs or ids a task here still needs) nor one a container uses. The removed ones."""
        kept_ids = _ids(client, keep)
        removed: list[PulledImage] = []
        with self._locked() as images:
            own = _own_bytes(client)
            for entry in sorted(images.values(), key=lambda e: e.last_used):
                total = sum(own.get(e.image_id, e.size_bytes) for e in images.values())
                if total <= budget_bytes:
                    break
                if entry.image_id in kept_ids:
                    continue
                try:
                    remove_image(client, entry.image_id)
                except ImageNotFound:
                    pass  # removed by someone else: it no longer takes room
                except APIError as e:  # a container (ours or not) still uses it: it stays
                    log.info("image_eviction_skipped", image=entry.name, why=public_registry_message(str(e))[:120])
                    continue
                del images[entry.image_id]
                removed.append(entry)
                log.info("image_evicted", image=entry.name, digest=entry.digest, size_bytes=entry.size_bytes)
        return removed


def _own_bytes(client: docker.DockerClient) -> dict[str, int]:
    """Each image's own bytes on disk (``docker system df``: its size less the layers it shares), so
    a budget counts what removing an image would free, not the base layers every task image shares."""
    try:
        return image_own_bytes(client)
    except DockerException:
        return {}


def _ids(client: docker.DockerClient, refs: Iterable[str]) -> set[str]:
    ids: set[str] = set()
    for ref in refs:
        try:
            found = local_image(client, ref)
        except APIError:
            continue
        if found is not None:
            ids.add(found.id)
    return ids


def images_report(state_dir: Path) -> list[dict[str, Any]]:
    """``--images list``: name, digest, size and last use of each image the runner pulled here (no paths)."""
    return [{"name": e.name, "digest": e.digest, "image_id": e.image_id, "size_bytes": e.size_bytes,
             "last_used": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(e.last_used))}
            for e in PulledImages(state_dir).entries()]


def gigabytes(value: float) -> int:
    return int(value * 1024**3)
