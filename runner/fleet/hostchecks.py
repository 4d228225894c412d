"""Can this host take a task now? Docker answers, disks have room, codex and its login are there;
and can it run the agent a task names (``AgentChecks``)?

Invariants: never raises for a broken host (each check answers ok or not, with an
actionable, public-safe detail: no path, no secret); a worker takes nothing while
any check of ``check_host`` fails, so a broken host stops taking work instead of failing
every task. Codex, the default agent, is one of those checks; any other agent a task
names is checked by the agent seam's own checks (``agent_host_checks``) when a task first
needs it, remembered ``AGENT_CHECK_SECONDS``, and a task whose agent fails them is not
started here (an infrastructure failure, retried by the fleet's rule, never the agent's).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from runner.agents import DEFAULT_AGENT, AgentName
from runner.docker_utils import connect, data_root
from runner.errors import DockerUnavailableError
from runner.phases.precheck import Check, agent_host_checks, host_checks
from runner.settings import DEFAULT_TAG
from runner.tasks.spec import HostSettings, TaskSpec, resolve

GIB = 1024**3
AGENT_CHECK_SECONDS = 60.0  # how long a worker trusts an agent's checks (a CLI installed or removed meanwhile)


class HostReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    healthy: bool
    checks: list[Check]

    def failing(self) -> list[Check]:
        return [check for check in self.checks if not check.ok]


def _free_disk(name: str, path: Path, min_free_gb: float) -> Check:
    try:
        free = shutil.disk_usage(path).free
    except OSError as e:
        return Check(name=name, ok=False, detail=f"cannot be measured ({e.strerror or type(e).__name__})")
    ok = free >= min_free_gb * GIB
    detail = f"{free / GIB:.1f} GiB free, at least {min_free_gb:g} GiB wanted (--min-free-gb)"
    return Check(name=name, ok=ok, detail=detail if ok else detail + "; free space or move the directory")


def check_host(jobs_dir: Path, host: HostSettings, min_free_gb: float) -> HostReport:
    """The precheck's host checks (``host_checks``: codex, its login, git), Docker, and room on both disks."""
    checks: list[Check] = []
    try:
        client = connect(timeout=10)
    except DockerUnavailableError as e:
        checks.append(Check(name="docker_daemon", ok=False, detail=str(e)))
    else:
        try:
            checks.append(Check(name="docker_daemon", ok=True, detail="the daemon answers"))
            root = Path(data_root(client))
            if root.is_absolute() and root.is_dir():
                checks.append(_free_disk("docker_disk", root, min_free_gb))
            else:
                checks.append(Check(name="docker_disk", ok=True, detail="Docker's data root is not on this host; not measured"))
        except Exception as e:  # docker-py raises several kinds here; each means the same
            checks.append(Check(name="docker_disk", ok=False, detail=f"docker info failed ({type(e).__name__})"))
        finally:
            client.close()
    checks.append(_free_disk("jobs_disk", jobs_dir, min_free_gb))
    checks += host_checks(host.codex_bin, host.codex_home)[0]
    return HostReport(healthy=all(check.ok for check in checks), checks=checks)


class AgentChecks:
    """The checks of each agent a task names, other than the default (``check_host`` makes codex's),
    made when a task first needs them and remembered ``ttl`` seconds; thread-safe (a worker's slots)."""

    def __init__(self, host: HostSettings, ttl: float = AGENT_CHECK_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._host, self._ttl, self._clock = host, ttl, clock
        self._lock = threading.Lock()
        self._known: dict[AgentName, tuple[float, list[Check]]] = {}

    def checks(self, agent: AgentName) -> list[Check]:
        """``agent``'s checks on this host (installed, version, login), as the precheck makes them."""
        if agent is DEFAULT_AGENT:
            return []  # the host's own checks, every --check-interval
        with self._lock:
            known = self._known.get(agent)
            if known is not None and self._clock() - known[0] < self._ttl:
                return known[1]
        settings = resolve(TaskSpec(tag=DEFAULT_TAG, agent=agent), self._host)
        found = [check for check in agent_host_checks(settings)[0] if check.name != "git_binary"]  # the host's own
        with self._lock:
            self._known[agent] = (self._clock(), found)
        return found

    def reported(self) -> list[Check]:
        """Every agent's checks made so far, for the worker's health."""
        with self._lock:
            return [check for agent in sorted(self._known) for check in self._known[agent][1]]
