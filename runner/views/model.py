"""What the views read: a host's health and one row per task and attempt.

Invariants: every model is frozen and refuses unknown fields; names that end up
in metric labels or on the page (state, phase, token kind, check name) come from
closed sets or narrow patterns, so no task text or path can become a label.
Free text (a check's detail) is still passed through the public guard before it
is shown (``runner.views.public``).
"""

from __future__ import annotations

import threading
from typing import Literal, Protocol, runtime_checkable

from pydantic import Field, field_validator, model_validator

from reducers.models import Frozen, Phase
from reducers.outcome import FINISHED_STATES, TaskState  # noqa: F401 (the views' states are the ledgers', re-exported)
from runner.bounded_read import Unreadable

# The phases a task reports durations for, in pipeline order (reduce is bookkeeping).
TIMED_PHASES: tuple[str, ...] = tuple(p.value for p in Phase if p is not Phase.REDUCE)
# Token kinds, as the compact result's metrics name them (cached input is part of input).
TOKEN_KINDS: tuple[str, ...] = ("input", "cached_input", "output")
_NAME = r"^[a-z0-9][a-z0-9_]{0,47}$"
_SUITE = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
_TAG = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,119}$"  # runner.settings.SAFE_TAG
_HOST = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_LABEL = r"^[a-z0-9_]{1,128}$"
_AGENT = r"^[a-z0-9][a-z0-9-]{0,31}$"  # runner.agents.AgentName's spelling
_DIGEST = r"^sha256:[0-9a-f]{64}$"





class HostCheck(Frozen):
    """One host check (docker, disk, codex, codex_login, broker, ...)."""

    name: str = Field(pattern=_NAME)
    ok: bool
    detail: str = ""


class HealthReport(Frozen):
    checks: list[HostCheck]
    taking_work: bool
    draining: bool = False
    slots_busy: int = Field(ge=0)
    slots_total: int = Field(ge=0)

    @property
    def healthy(self) -> bool:
        """What /healthz answers 200 for: taking work and not draining."""
        return self.taking_work and not self.draining

    @property
    def failing(self) -> list[HostCheck]:
        return [check for check in self.checks if not check.ok]


class TaskRow(Frozen):
    """One (suite, tag, attempt): where it is, how it ended, what it cost."""

    suite: str = Field(pattern=_SUITE)
    kind: Literal["task", "eval"] = "task"  # an agent's run, or one patch scored (a fleet's evaluation unit)
    tag: str = Field(pattern=_TAG)
    attempt: int = Field(ge=0)
    patch: str | None = Field(default=None, pattern=_TAG)  # an evaluation unit's patch name
    state: TaskState
    host: str | None = Field(default=None, pattern=_HOST)
    phase: Phase | None = None  # the phase running now (running) or where it stopped
    resolved: bool | None = None
    infra_failure: bool | None = None
    failure_label: str | None = Field(default=None, pattern=_LABEL)
    phase_seconds: dict[str, float] = Field(default_factory=dict)
    wall_seconds: float | None = Field(default=None, ge=0)
    tokens: dict[str, int] = Field(default_factory=dict)
    cost_usd: float | None = Field(default=None, ge=0)  # on the rate card; None: unknown or not run
    agent: str | None = Field(default=None, pattern=_AGENT)  # who made the attempt; None: unknown (or a patch scored)
    # The image the attempt ran on, as pinned: its repo digest, or its id for an image built here.
    image: str | None = Field(default=None, pattern=_DIGEST)
    unreadable: Unreadable | None = None  # why, for an unreadable row (and only for one)

    @model_validator(mode="after")
    def _unreadable_says_why(self) -> TaskRow:
        if (self.state is TaskState.UNREADABLE) != (self.unreadable is not None):
            raise ValueError("an unreadable row, and only one, gives its reason (unreadable)")
        return self

    @field_validator("image", mode="before")
    @classmethod
    def _digest_alone(cls, value: object) -> object:
        """A ledger holds ``repository@sha256:...``; the page shows the digest alone (no registry host)."""
        return value.rpartition("@")[2] if isinstance(value, str) else value

    @field_validator("phase_seconds")
    @classmethod
    def _known_phases(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(TIMED_PHASES))
        if unknown:
            raise ValueError(f"unknown phase(s) {unknown}; expected some of {list(TIMED_PHASES)}")
        if any(seconds < 0 for seconds in value.values()):
            raise ValueError("phase durations cannot be negative")
        return value

    @field_validator("tokens")
    @classmethod
    def _known_kinds(cls, value: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(value) - set(TOKEN_KINDS))
        if unknown:
            raise ValueError(f"unknown token kind(s) {unknown}; expected some of {list(TOKEN_KINDS)}")
        if any(count < 0 for count in value.values()):
            raise ValueError("token counts cannot be negative")
        return value

    @property
    def key(self) -> tuple[str, str, int, str]:
        """A suite that compares agents holds one row per (tag, attempt) for each of them."""
        return (self.suite, self.tag, self.attempt, self.agent or "")

    @property
    def spent_tokens(self) -> bool:
        return sum(self.tokens.values()) > 0


@runtime_checkable
class StatusSource(Protocol):
    """What the views need from a worker (or a batch, or a suite ledger)."""

    def health(self) -> HealthReport: ...

    def rows(self) -> list[TaskRow]: ...


class SnapshotSource:
    """A thread-safe in-memory ``StatusSource``: a worker (or a test) pushes, the server reads.

    A row is keyed by (suite, tag, attempt, agent); ``upsert`` replaces the earlier one.
    """

    def __init__(self, health: HealthReport, rows: list[TaskRow] | None = None) -> None:
        self._lock = threading.Lock()
        self._health = health
        self._rows: dict[tuple[str, str, int, str], TaskRow] = {}
        for row in rows or []:
            self._rows[row.key] = row

    def health(self) -> HealthReport:
        with self._lock:
            return self._health

    def rows(self) -> list[TaskRow]:
        with self._lock:
            return sorted(self._rows.values(), key=lambda row: row.key)

    def set_health(self, health: HealthReport) -> None:
        with self._lock:
            self._health = health

    def upsert(self, row: TaskRow) -> None:
        with self._lock:
            self._rows[row.key] = row
