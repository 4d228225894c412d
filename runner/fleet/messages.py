"""The queue's task message: one (suite, tag, attempt), its task settings and its prompt.

Invariants: a message is validated in full before any work (the same rules as a
single run's settings, plus a safe suite name), so a bad message becomes a failed
ledger row and never a crashed worker; its identity (``message_id``) is derived
from (suite, tag, attempt), so a resubmission and a redelivery name the same task.
The prompt travels in the message (the broker is trusted) and goes nowhere public.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from runner.errors import BadInputError
from runner.settings import RunnerSettings, is_safe_tag
from runner.tags import MAX_ATTEMPTS

# A suite name ends up in Redis keys and host paths: no shell, no spaces, no '..'.
SAFE_SUITE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
SAFE_QUEUE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")
MAX_PROMPT_BYTES = 1024 * 1024
ACTOR_NAME = "run_task"
DEFAULT_QUEUE = "runner"
_SAFE_LOC = re.compile(r"[A-Za-z0-9_]{1,40}")  # a field name to show; anything else is not echoed
_IDENTITY = uuid.UUID("5d1c3f3e-3a55-4d2e-9a57-6b0c1b7f3a21")


class MessageError(BadInputError):
    """A message (or a submission) that cannot become a task; names the fields, never their values."""

    reason = "bad_message"


def check_suite(suite: str) -> str:
    if not SAFE_SUITE.fullmatch(suite) or ".." in suite:
        raise MessageError("suite name must be 1-64 letters, digits, '_', '.' or '-', starting with a letter, digit or '_'")
    return suite


def check_queue(queue: str) -> str:
    if not SAFE_QUEUE.fullmatch(queue):
        raise MessageError("queue name must be 1-64 letters, digits, '_' or '-'")
    return queue


def task_key(tag: str, attempt: int) -> str:
    """The ledger field of one task: ``<tag>/<attempt>``."""
    return f"{tag}/{attempt}"


def message_id(suite: str, tag: str, attempt: int) -> str:
    return str(uuid.uuid5(_IDENTITY, f"{suite}/{task_key(tag, attempt)}"))


class TaskOptions(BaseModel):
    """A task's settings, resolved at submit time, so every host runs it the same way."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str | None = None
    allow_pull: bool = False
    codex_timeout: float = Field(gt=0)
    eval_timeout: float = Field(gt=0)
    eval_network: str
    source_dir: str
    apply_cmd: str
    test_cmd: str

    @classmethod
    def from_settings(cls, settings: RunnerSettings, image: str | None) -> TaskOptions:
        return cls(
            image=image, allow_pull=settings.allow_pull, codex_timeout=settings.codex_timeout,
            eval_timeout=settings.eval_timeout, eval_network=settings.eval_network.value,
            source_dir=settings.source_dir, apply_cmd=settings.apply_cmd, test_cmd=settings.test_cmd,
        )


class TaskMessage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    suite: str
    tag: str
    attempt: int = Field(ge=1, le=MAX_ATTEMPTS)
    prompt: str = Field(min_length=1)
    options: TaskOptions

    @field_validator("suite")
    @classmethod
    def _suite_is_safe(cls, value: str) -> str:
        if not SAFE_SUITE.fullmatch(value) or ".." in value:
            raise ValueError("not a safe suite name")
        return value

    @field_validator("tag")
    @classmethod
    def _tag_is_safe(cls, value: str) -> str:
        if not is_safe_tag(value):
            raise ValueError("not a safe tag")
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt_is_real(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the prompt is empty")
        if len(value.encode()) > MAX_PROMPT_BYTES:
            raise ValueError("the prompt is larger than 1 MiB")
        return value

    @property
    def key(self) -> str:
        return task_key(self.tag, self.attempt)

    @property
    def message_id(self) -> str:
        return message_id(self.suite, self.tag, self.attempt)

    def settings_overrides(self) -> dict[str, Any]:
        """The task's part of a single run's settings (the host adds codex_bin and job_root)."""
        return {"tag": self.tag, **self.options.model_dump()}


def parse_message(payload: Any) -> TaskMessage:
    """A queue payload to a task.

    Raises:
        MessageError: naming each bad field (never echoing its value, which may be anything).
    """
    try:
        return TaskMessage.model_validate(payload)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            where = ".".join(str(part) if _SAFE_LOC.fullmatch(str(part)) else "<field>" for part in err["loc"])
            problems.append(f"{where or 'message'}: {err['msg'].removeprefix('Value error, ')}")
        raise MessageError("malformed task message: " + "; ".join(problems[:5])) from None
