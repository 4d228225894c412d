"""The messages of a task: what a task process is handed and says back, and the fleet's message.

A task process reads one ``TaskRequest`` (JSON on stdin) and writes ``PhaseStarted``
lines, then one ``TaskOutcome``, on a pipe of its own (``runner.tasks.supervisor``).
A fleet's queue carries ``TaskMessage``: ``{suite, attempt, prompt, spec}``, where the
spec is the very ``TaskSpec`` a single run or a batch hands its task, so a fleet task
is run and scored exactly as they do; the worker adds only where it runs (its jobs dir)
and its own host's settings.

Invariants: a message is validated in full before any work (a bad one becomes a
failed ledger row, never a crashed worker, and its values are never echoed); a fleet
task's identity (``message_id``) is derived from (suite, tag, attempt), so a
resubmission and a redelivery name the same task; the prompt travels in the message
(the broker is trusted) and goes nowhere public.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, Field, TypeAdapter, ValidationError, field_validator

from reducers.compact import BenchmarkRun
from reducers.models import Frozen, Phase, ReduceResult
from runner.agents import DEFAULT_AGENT
from runner.errors import ExitCode, MessageError
from runner.settings import TASK_ENV, HostPath
from runner.tags import MAX_ATTEMPTS
from runner.tasks.spec import HostSettings, TaskSpec

# A suite name ends up in Redis keys and host paths: no shell, no spaces, no '..'.
SAFE_SUITE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
MAX_PROMPT_BYTES = 1024 * 1024
_SAFE_LOC = re.compile(r"[A-Za-z0-9_]{1,40}")  # a field name to show; anything else is not echoed
_IDENTITY = uuid.UUID("5d1c3f3e-3a55-4d2e-9a57-6b0c1b7f3a21")


# -- a task process ----------------------------------------------------------------------------


# A patch travels in its evaluation message (base64, its sha256 checked on the worker): Redis holds
# it whole, so the queue takes patches up to this size; a larger one is scored with ``evaluate``.
MAX_QUEUED_PATCH_BYTES = 8 * 1024 * 1024
_SHA256 = re.compile(r"[0-9a-f]{64}")
_PATCH_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,119}")


def _patch_name(value: str) -> str:
    if not _PATCH_NAME.fullmatch(value) or ".." in value:
        raise ValueError("not a safe patch name")
    return value


def safe_patch_name(value: object) -> bool:
    return isinstance(value, str) and bool(_PATCH_NAME.fullmatch(value)) and ".." not in value


def _sha256(value: str) -> str:
    if not _SHA256.fullmatch(value):
        raise ValueError("not a sha256 in hex")
    return value


class EvalUnit(Frozen):
    """One patch to score, as ``runner.patch_sets`` classified it on the submitting host."""

    name: Annotated[str, AfterValidator(_patch_name)]  # the public name (a file name, or patch-<sha12>)
    directory: str | None = Field(default=None, max_length=200)  # the tag directory's name, when it differs
    attempt: int | None = Field(default=None, ge=1, le=MAX_ATTEMPTS)
    sha256: Annotated[str, AfterValidator(_sha256)]
    size: int = Field(ge=0)
    rejection: Literal["empty_patch", "not_a_patch", "patch_too_large", "not_a_regular_file"] | None = None


class TaskRequest(Frozen):
    """What a task process reads on stdin: the task, where it runs, and the host's settings.

    With ``evaluation``, the process scores that one patch (``job_root/<name>``) instead of
    running an agent: ``runner.score_patches.score_units`` with ``job_root`` as its jobs dir.
    """

    spec: TaskSpec
    job_root: HostPath
    attempt: int | None = Field(default=None, ge=1, le=MAX_ATTEMPTS)  # i of .../attempt-<i>; None: a tag's only run
    host: HostSettings
    evaluation: EvalUnit | None = None


class PhaseStarted(Frozen):
    kind: Literal["phase"] = "phase"
    phase: Phase


class TaskOutcome(Frozen):
    """The task process's last message: its exit code and, when it got that far, its result."""

    kind: Literal["outcome"] = "outcome"
    exit_code: ExitCode  # as the CLI would exit for this task
    message: str | None = None  # public-safe: why it was refused or interrupted
    reduced: ReduceResult | None = None
    run: BenchmarkRun | None = None  # benchmark_run.compact.json as the task wrote it
    evaluation: dict[str, Any] | None = None  # an evaluation unit's row (``runner.score_patches.EvalRow``)


TaskEvent = TypeAdapter(Annotated[Union[PhaseStarted, TaskOutcome], Field(discriminator="kind")])


# -- the fleet's message -----------------------------------------------------------------------


def check_suite(suite: str) -> str:
    """Raises: MessageError, for a name that cannot be a Redis key part and a directory."""
    if not SAFE_SUITE.fullmatch(suite) or ".." in suite:
        raise MessageError("suite name must be 1-64 letters, digits, '_', '.' or '-', starting with a letter, digit or '_'")
    return suite


def _suite(value: str) -> str:
    if not SAFE_SUITE.fullmatch(value) or ".." in value:
        raise ValueError("not a safe suite name")
    return value


def task_arm(agent: str | None) -> str | None:
    """The arm of a task naming ``agent``, as the batch's ``--agents`` names it: None for codex (the
    default, keyed as before the seam), else the agent's name, so one suite holds both agents' attempts."""
    return None if agent is None or agent == DEFAULT_AGENT.value else str(agent)


def task_key(tag: str, attempt: int, arm: str | None = None) -> str:
    """The ledger field of one fleet task: ``<tag>/<attempt>``, or ``<tag>/<arm>/<attempt>``."""
    return f"{tag}/{attempt}" if arm is None else f"{tag}/{arm}/{attempt}"


def message_id(suite: str, tag: str, attempt: int, arm: str | None = None) -> str:
    return str(uuid.uuid5(_IDENTITY, f"{suite}/{task_key(tag, attempt, arm)}"))


class TaskMessage(Frozen):
    """One fleet task: ``{suite, attempt, prompt, spec}``."""

    suite: Annotated[str, AfterValidator(_suite)]
    attempt: int = Field(ge=1, le=MAX_ATTEMPTS)
    prompt: str = Field(min_length=1)
    spec: TaskSpec

    @field_validator("prompt")
    @classmethod
    def _prompt_is_real(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the prompt is empty")
        if len(value.encode()) > MAX_PROMPT_BYTES:
            raise ValueError("the prompt is larger than 1 MiB")
        return value

    @property
    def tag(self) -> str:
        return self.spec.tag

    @property
    def arm(self) -> str | None:
        return task_arm(self.spec.agent)

    @property
    def key(self) -> str:
        return task_key(self.tag, self.attempt, self.arm)

    @property
    def message_id(self) -> str:
        return message_id(self.suite, self.tag, self.attempt, self.arm)

    def request(self, job_root: Path, host: HostSettings) -> TaskRequest:
        """The task as this worker runs it: its job root there, its own host's settings."""
        return TaskRequest(spec=self.spec, job_root=job_root, attempt=self.attempt, host=host)


def parse_message(payload: Any) -> TaskMessage:
    """A queue payload to a task.

    Raises:
        MessageError: naming each bad field (never echoing its value, which may be anything).
    """
    try:
        return TaskMessage.model_validate(payload)
    except ValidationError as e:
        raise MessageError("malformed task message: " + _problems(e)) from None


def _problems(e: ValidationError) -> str:
    problems = []
    for err in e.errors():
        where = ".".join(str(part) if _SAFE_LOC.fullmatch(str(part)) else "<field>" for part in err["loc"])
        problems.append(f"{where or 'message'}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(problems[:5])


# -- the fleet's evaluation message --------------------------------------------------------------


def eval_key(tag: str, name: str) -> str:
    """The ledger field of one evaluation unit: ``<tag>/<patch name>``, as ``evaluate``'s ledger keys it."""
    return f"{tag}/{name}"


class EvalMessage(Frozen):
    """One fleet evaluation unit: ``{kind: "eval", suite, spec, unit, data}``; ``data`` is the patch, base64."""

    kind: Literal["eval"] = "eval"
    suite: Annotated[str, AfterValidator(_suite)]
    spec: TaskSpec  # how the tag is evaluated (image, deadline, network, commands): as a task's spec says it
    unit: EvalUnit
    data: str = Field(max_length=(MAX_QUEUED_PATCH_BYTES + 2) // 3 * 4)

    @field_validator("data")
    @classmethod
    def _base64(cls, value: str) -> str:
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("the patch is not base64") from None
        return value

    def patch_bytes(self) -> bytes:
        """The patch, checked against its sha256 and size. Raises: MessageError, when they differ."""
        data = base64.b64decode(self.data, validate=True)
        if self.unit.rejection is not None:
            if data:
                raise MessageError("malformed evaluation message: a rejected patch carries no bytes")
            return data
        if len(data) != self.unit.size or hashlib.sha256(data).hexdigest() != self.unit.sha256:
            raise MessageError("malformed evaluation message: the patch's bytes do not match its sha256")
        return data

    @property
    def tag(self) -> str:
        return self.spec.tag

    @property
    def attempt(self) -> int:
        return self.unit.attempt or 1

    @property
    def key(self) -> str:
        return eval_key(self.tag, self.unit.name)

    @property
    def message_id(self) -> str:
        return str(uuid.uuid5(_IDENTITY, f"{self.suite}/eval/{self.key}/{self.unit.sha256}"))

    def request(self, job_root: Path, host: HostSettings) -> TaskRequest:
        return TaskRequest(spec=self.spec, job_root=job_root, host=host, evaluation=self.unit)


def parse_any_message(payload: Any) -> TaskMessage | EvalMessage:
    """A queue payload to a task or an evaluation unit (``kind: "eval"``).

    Raises:
        MessageError: naming each bad field (never echoing its value), or the patch's bytes do not match.
    """
    if not (isinstance(payload, dict) and payload.get("kind") == "eval"):
        return parse_message(payload)
    try:
        message = EvalMessage.model_validate(payload)
    except ValidationError as e:
        raise MessageError("malformed evaluation message: " + _problems(e)) from None
    message.patch_bytes()
    return message


def task_environment(environ: dict[str, str] | os._Environ) -> dict[str, str]:
    """The environment a task process (cold or forked) is given: the supervisor's, without the
    variables that name one task (those come in the request)."""
    return {key: value for key, value in environ.items() if key not in TASK_ENV}
