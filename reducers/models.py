"""Typed shapes shared by the runner (which writes them) and the reducers (which read them).

Pure: imports neither docker nor git, touches no file.
"""

from __future__ import annotations

from enum import Enum
from typing import Union

from pydantic import BaseModel, ConfigDict, Field


class Phase(str, Enum):
    PREPARE = "prepare"
    PRECHECK = "precheck"
    EXTRACT = "extract"
    BASELINE = "baseline"
    CODEX = "codex"
    PATCH = "patch"
    EVALUATE = "evaluate"
    REDUCE = "reduce"


# The order of a full run; reduce always runs, the others resume from their markers.
PHASE_ORDER: tuple[Phase, ...] = tuple(Phase)


class MarkerStatus(str, Enum):
    OK = "ok"
    FAILED = "failed"


Scalar = Union[str, int, float, bool, None]


class Marker(BaseModel):
    """One phase's record. Written only by the runner, public-safe by construction."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    phase: Phase
    status: MarkerStatus
    started_at: str
    ended_at: str
    duration_seconds: float = Field(ge=0)
    exit_code: int | None = None
    reason: str = Field(pattern=r"^[a-z0-9_]{1,64}$")
    details: dict[str, Scalar] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status is MarkerStatus.OK
