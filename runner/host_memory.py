"""Facts about this host that many tasks would each find out again: kept in the state dir.

A network probe's answer, an image's layout, codex's version and login are facts about the
host, its network, an image id or a binary, not about a task; a batch, an ``evaluate`` run or
a worker used to pay a container or a process for each of them per task. Each fact is a small
record under ``<state dir>/<kind>/``, named by a hash of the full question and holding the
question too (a record answers only the question it was made for), with the time it was found.

Invariants:
- a record is believed only when it is a regular file inside its directory, small, valid
  against the fact's own model, made for this very question and not older than the kind's
  ``max_age`` (nor from the future); anything else is asked again, never an error;
- one task at a time finds a fact out (a file lock per question); the others wait for its
  answer, and a waiter gives up after ``wait_seconds`` and finds out for itself;
- a state dir that cannot hold the memory costs only the memory: the fact is found out as
  if nothing were kept.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import structlog
from pydantic import BaseModel, ConfigDict, ValidationError

from runner.atomic import write_json_atomic
from runner.bounded_read import UnreadableFileError, read_bounded_json

log = structlog.get_logger(__name__)

Fact = TypeVar("Fact", bound=BaseModel)
_MAX_RECORD_BYTES = 16 * 1024


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    question: str
    found_at: float  # time.time() when it was found out
    fact: dict[str, Any]


@dataclass(frozen=True)
class HostMemory:
    """One kind of fact (``<state dir>/<kind>/``), kept ``max_age`` seconds (None: for good)."""

    directory: Path
    max_age: float | None
    wait_seconds: float = 60.0

    @classmethod
    def in_state_dir(cls, state_dir: Path, kind: str, *, max_age: float | None, wait_seconds: float = 60.0) -> HostMemory:
        return cls(state_dir / kind, max_age, wait_seconds)

    @staticmethod
    def question(*parts: Any) -> str:
        """The question as one string: what a record must have been made for."""
        return json.dumps(parts, sort_keys=True, default=str)

    def _path(self, question: str, suffix: str) -> Path:
        return self.directory / f"{hashlib.sha256(question.encode()).hexdigest()[:32]}{suffix}"

    @contextmanager
    def turn(self, question: str) -> Iterator[None]:
        """Held while one task finds the fact out, so the others wait for its answer."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self._path(question, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            log.warning("host_memory_unusable", kind=self.directory.name, error_type=type(e).__name__)
            yield
            return
        try:
            deadline = time.monotonic() + self.wait_seconds
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        break  # the holder is stuck: find it out alone
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # releases the lock

    def recall(self, question: str, model: type[Fact]) -> Fact | None:
        path = self._path(question, ".json")
        if not path.is_file():
            return None
        try:
            record = _Record.model_validate(read_bounded_json(path, root=self.directory,
                                                              max_bytes=_MAX_RECORD_BYTES, max_depth=4))
            fact = model.model_validate(record.fact)
        except (UnreadableFileError, ValidationError):
            return None  # damaged or planted: asked again, never believed
        age = time.time() - record.found_at
        if record.question != question or age < 0 or (self.max_age is not None and age > self.max_age):
            return None
        return fact

    def remember(self, question: str, fact: BaseModel) -> None:
        record = _Record(question=question, found_at=time.time(), fact=fact.model_dump(mode="json"))
        try:
            write_json_atomic(self._path(question, ".json"), record.model_dump())
        except OSError as e:  # a full state disk: the fact stands, only the next task finds it out again
            log.warning("host_memory_unusable", kind=self.directory.name, error_type=type(e).__name__)
