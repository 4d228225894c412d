"""The agent seam: what the guarded agent phase (``runner.phases.agent``) asks of an agent CLI.

The phase owns every guard, the same for each agent: the prompt file on stdin, a fresh
private HOME in the job root, the child's environment built from an allowlist, the PID
namespace that dies with the runner (``runner.containment``), the deadline and the live
caps, the kill of the whole process group and of every straggler, the tamper check of the
runner's files and of ``buggy-source/`` itself. An agent only says, for one attempt:

- ``binary`` / ``version`` / ``login``: is it installed, which version, can it reach its model;
- ``launch``: its argv, its environment (from the allowlist it declares), its usage meter,
  and the model it will be priced as;
- ``finish``: its usage and failure class, read back from its own event stream, after the
  last message (``job.last_message``) is where the runner expects it.

Codex (``runner.agents.codex``) is the first and default; Claude Code
(``runner.agents.claude_code``) the second.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from runner.codex_usage import CodexUsage, TokenCounts

if TYPE_CHECKING:
    from runner.context import JobContext
    from runner.host_memory import HostMemory
    from runner.phases.precheck import Check
    from runner.settings import RunnerSettings


class AgentName(StrEnum):
    """The agents a task may name (``--agent``); the value is the public name in markers and ledgers."""

    CODEX = "codex"
    CLAUDE_CODE = "claude-code"


DEFAULT_AGENT = AgentName.CODEX


class Meter(Protocol):
    def poll(self) -> TokenCounts | None:
        """The latest running total of the attempt's usage (None: none yet)."""


@dataclass(frozen=True)
class Launch:
    """One attempt of an agent, as the phase runs it."""

    argv: list[str]
    env: dict[str, str]
    meter: Meter
    model: str | None  # what the rate card prices it as (None: unknown)
    overrides_sha256: str = ""  # the operator's config overrides, hashed (codex's -c)


class Agent(Protocol):
    name: AgentName
    log_name: str  # the prefix of its log events (``codex_started``)
    stdout_log: str  # under logs/: its event stream
    stderr_log: str

    def binary(self, settings: RunnerSettings) -> str:
        """The executable's absolute path. Raises: AgentNotFoundError."""

    def version(self, settings: RunnerSettings) -> str:
        """A short public-safe version string. Raises: AgentNotFoundError."""

    def login(self, settings: RunnerSettings, memory: HostMemory | None = None) -> Check:
        """Can it reach its model (logged in, or its key variable set)? Names only, never values."""

    def launch(self, ctx: JobContext, path: str, home: Path) -> Launch:
        """The argv, environment and meter of one attempt in ``ctx``'s job root, HOME ``home``."""

    def finish(self, ctx: JobContext, stdout: Path) -> CodexUsage:
        """After it ended: its usage and failure class from its event stream; its last message in place."""


def executable(name: str, missing: Callable[[str], Exception]) -> str:
    """``name`` found on PATH, as an absolute path (the agent runs in buggy-source: a relative one would miss).

    Raises:
        the ``missing(name)`` error: it is not found.
    """
    import os
    import shutil

    found = shutil.which(name)
    if found is None:
        raise missing(name)
    return os.path.abspath(found)


class CliAgent:
    """What every agent CLI has alike: its logs named after it, its executable a host setting."""

    name: AgentName
    log_name: str
    bin_setting: str  # the RunnerSettings field naming its executable
    missing: Callable[[str], Exception]  # the error when it is not found

    @property
    def stdout_log(self) -> str:
        return f"{self.name.value}.stdout.log"

    @property
    def stderr_log(self) -> str:
        return f"{self.name.value}.stderr.log"

    def binary(self, settings: RunnerSettings) -> str:
        return executable(getattr(settings, self.bin_setting), type(self).missing)


def agent_for(name: str | AgentName) -> Agent:
    """The implementation of ``name``.

    Raises:
        BadInputError: not an agent the runner knows.
    """
    from runner.errors import BadInputError

    factories: dict[AgentName, Callable[[], Agent]] = {AgentName.CODEX: _codex, AgentName.CLAUDE_CODE: _claude_code}
    try:
        return factories[AgentName(name)]()
    except ValueError:
        known = ", ".join(agent.value for agent in AgentName)
        raise BadInputError(f"--agent: unknown agent {str(name)[:40]!r}; one of {known}") from None


def _codex() -> Agent:
    from runner.agents.codex import CodexAgent

    return CodexAgent()


def _claude_code() -> Agent:
    from runner.agents.claude_code import ClaudeCodeAgent

    return ClaudeCodeAgent()
