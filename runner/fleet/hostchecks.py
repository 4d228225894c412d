"""Can this host take a task now? Docker answers, disks have room, codex and its login are there.

Invariants: never raises for a broken host (each check answers ok or not, with an
actionable, public-safe detail: no path, no secret); a worker takes nothing while
any check fails, so a broken host stops taking work instead of failing every task.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from runner.docker_utils import connect, data_root
from runner.errors import DockerUnavailableError
from runner.phases.precheck import Check, host_checks
from runner.tasks.spec import HostSettings

GIB = 1024**3


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
