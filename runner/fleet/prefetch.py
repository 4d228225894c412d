"""Prefetch: a worker pulls the images of the next messages of its queues while its slots run tasks,
so a task's start does not wait for a pull that could have happened during the previous one's codex.

Invariants:
- read only: the queue's head is peeked (``LRANGE`` on Dramatiq's list and ``HMGET`` on its
  messages), never taken; another worker may take those messages, and then the image was
  pulled for nothing but is still the runner's own, so the disk policy may evict it;
- one pull at a time, and only with ``--allow-pull``; a pull that fails is left to the task that
  needs the image (its precheck pulls again and fails as infrastructure, named);
- the images peeked are ``wanted()``: eviction keeps them as it keeps the running tasks' images;
- under an image budget a pull waits until, after eviction, the runner's images and one more fit
  (``room``): prefetching never takes a host past its budget.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import docker
import redis
import structlog

from runner.docker_utils import connect, local_image
from runner.errors import RunnerError
from runner.fleet.broker import Keys
from runner.images import PulledImages, pull_image
from runner.tasks.protocol import MessageError, TaskMessage, parse_any_message
from runner.tasks.spec import HostSettings, resolve

log = structlog.get_logger(__name__)

PEEK_EVERY_SECONDS = 1.0


def _payload(raw: bytes | None) -> object:
    """A Dramatiq message's first argument (the runner's payload), or None."""
    try:
        message = json.loads(raw) if raw else None
        args = message.get("args") if isinstance(message, dict) else None
        return args[0] if isinstance(args, list) and args else None
    except (ValueError, TypeError):
        return None


class Prefetcher:
    """Pull the images of the next ``depth`` messages of ``queues`` (the worker runs it in a thread)."""

    def __init__(self, client: redis.Redis, keys: Keys, queues: list[str], host: HostSettings, depth: int,
                 state_dir, room: Callable[[docker.DockerClient, set[str]], bool] | None = None) -> None:
        """``room(client, wanted)``: may one more image be pulled now, keeping ``wanted`` (the host's disk
        policy, ``DiskPolicy.room_to_prefetch``)? None: always."""
        self._redis, self._keys, self._queues, self._host, self._depth = client, keys, queues, host, depth
        self._room = room
        self._pulled = PulledImages(state_dir)
        self._wanted: set[str] = set()
        self._lock = threading.Lock()
        self.pulls = 0

    def wanted(self) -> set[str]:
        with self._lock:
            return set(self._wanted)

    def next_images(self) -> list[str]:
        """The images of the next messages, in queue order (each once)."""
        refs: list[str] = []
        for queue in self._queues:
            name = self._keys.queue(queue)
            ids = self._redis.lrange(name, 0, self._depth - 1)
            if not ids:
                continue
            for raw in self._redis.hmget(f"{name}.msgs", ids):
                try:
                    task = parse_any_message(_payload(raw))
                except MessageError:
                    continue
                if isinstance(task, TaskMessage):
                    ref = resolve(task.spec, self._host).resolved_image
                    if ref not in refs:
                        refs.append(ref)
        return refs[: self._depth]

    def tick(self) -> int:
        """One look at the queues' heads, and a pull of each image not here yet; the pulls made."""
        refs = self.next_images()
        with self._lock:
            self._wanted = set(refs)
        if not refs:
            return 0
        made = 0
        client = connect()
        try:
            for ref in refs:
                if local_image(client, ref) is not None:
                    continue
                if self._room is not None and not self._room(client, set(refs)):
                    log.debug("image_prefetch_deferred", image=ref, reason="image budget")  # again next look
                    break
                try:
                    image = pull_image(client, ref, timeout=self._host.pull_timeout)
                except RunnerError as e:
                    log.info("image_prefetch_failed", image=ref, reason=e.reason)
                    continue
                self._pulled.pulled(image, ref, ref.partition("@")[2] or None)
                made += 1
                log.info("image_prefetched", image=ref)
        finally:
            client.close()
        self.pulls += made
        return made

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(PEEK_EVERY_SECONDS):
            try:
                self.tick()
            except (redis.RedisError, RunnerError) as e:  # the broker or the daemon is away: the host checks say so
                log.debug("image_prefetch_skipped", error_type=type(e).__name__)
