"""precheck: can this host run the task? The health probe, and the first phase of a run.

Invariants: needs no job root; the layout probe runs in a throwaway labelled
container that is always removed; the report holds no host path or secret.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field

import docker
from docker.errors import DockerException
from pydantic import BaseModel, ConfigDict

from reducers.models import Phase
from runner.context import JobContext, PhaseResult
from runner.docker_utils import connect, ensure_image, image_identity, managed_container
from runner.errors import (
    CodexNotFoundError,
    EnvironmentNotReadyError,
    ImageMissingError,
    RunnerError,
)
from runner.settings import RunnerSettings

VERSION_TIMEOUT = 30
PROBE_TIMEOUT = 120
# Exit-code bits of the layout probe, so each check gets its own answer from one container.
_PROBE_SCRIPT = (
    'rc=0; [ -d "$1" ] || rc=$((rc|1)); '
    'grep -q "apply_patch" "$2" 2>/dev/null || rc=$((rc|2)); '
    'grep -q "test_patched" "$2" 2>/dev/null || rc=$((rc|4)); exit $rc'
)
_PROBE_BITS = {
    "image_has_source_dir": (1, "the buggy-source directory is missing in the image; check --source-dir"),
    "entrypoint_knows_apply_patch": (2, "the entry script does not know apply_patch; check --apply-cmd"),
    "entrypoint_knows_test_patched": (4, "the entry script does not know test_patched; check --test-cmd"),
}
_VERSION_TEXT = re.compile(r"[^A-Za-z0-9 ._+-]")


class Check(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    ok: bool
    detail: str


class PrecheckReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    healthy: bool
    checks: list[Check]
    codex_version: str | None = None
    image_id: str | None = None

    def first_failure(self) -> Check | None:
        return next((check for check in self.checks if not check.ok), None)


@dataclass(frozen=True)
class PrecheckResult(PhaseResult):
    phase = Phase.PRECHECK
    codex_version: str | None = None
    image_id: str | None = None
    checks_passed: int = 0


def codex_version(codex_bin: str) -> str:
    """``codex --version``, reduced to a short public-safe string.

    Raises:
        CodexNotFoundError: not on PATH, not executable, or it cannot say its version.
    """
    path = shutil.which(codex_bin)
    if path is None:
        raise CodexNotFoundError(codex_bin)
    try:
        done = subprocess.run(
            [path, "--version"], capture_output=True, timeout=VERSION_TIMEOUT, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CodexNotFoundError(codex_bin) from e
    if done.returncode != 0:
        raise CodexNotFoundError(codex_bin)
    first_line = done.stdout.decode(errors="replace").strip().splitlines()[:1]
    return _VERSION_TEXT.sub("", first_line[0])[:64] if first_line else "unknown"


def _probe_layout(
    client: docker.DockerClient, settings: RunnerSettings, image_id: str, labels: dict[str, str]
) -> int:
    entry_script = shlex.split(settings.apply_cmd)[0]
    with managed_container(
        client,
        image=image_id,
        labels=labels,
        entrypoint=["/bin/sh", "-c", _PROBE_SCRIPT, "probe", settings.source_dir, entry_script],
        command=[],
        network_disabled=True,
    ) as container:
        container.start()
        status = container.wait(timeout=PROBE_TIMEOUT)
    return int(status.get("StatusCode", 255))


def run_precheck(settings: RunnerSettings, *, labels: dict[str, str]) -> PrecheckReport:
    """Every check, each with its own answer; never raises for an unhealthy host."""
    checks: list[Check] = []
    version: str | None = None
    image_id: str | None = None
    try:
        version = codex_version(settings.codex_bin)
        checks.append(Check(name="codex_binary", ok=True, detail=f"found, version {version}"))
    except CodexNotFoundError as e:
        checks.append(Check(name="codex_binary", ok=False, detail=str(e)))
    client: docker.DockerClient | None = None
    try:
        client = connect()
        checks.append(Check(name="docker_daemon", ok=True, detail="the daemon answers"))
        image = ensure_image(client, settings.resolved_image, allow_pull=settings.allow_pull)
        image_id, _digest = image_identity(image)
        checks.append(Check(name="image_present", ok=True, detail=f"{settings.resolved_image} present"))
        bits = _probe_layout(client, settings, image_id, labels)
        for name, (bit, problem) in _PROBE_BITS.items():
            ok = not bits & bit
            checks.append(Check(name=name, ok=ok, detail="yes" if ok else problem))
    except ImageMissingError as e:
        checks.append(Check(name="image_present", ok=False, detail=str(e)))
    except RunnerError as e:
        checks.append(Check(name="docker_daemon", ok=False, detail=str(e)))
    except DockerException as e:
        checks.append(Check(name="image_layout_probe", ok=False, detail=f"the probe container failed ({type(e).__name__})"))
    finally:
        if client is not None:
            client.close()
    healthy = all(check.ok for check in checks) and len(checks) == 2 + 1 + len(_PROBE_BITS)
    return PrecheckReport(healthy=healthy, checks=checks, codex_version=version, image_id=image_id)


def precheck(ctx: JobContext) -> PrecheckResult:
    """The run's precheck phase: the same checks, and the first failure raised.

    Raises:
        EnvironmentNotReadyError: with the failed check's actionable message.
    """
    report = run_precheck(ctx.settings, labels=ctx.labels(Phase.PRECHECK))
    failed = report.first_failure()
    if failed is not None:
        raise EnvironmentNotReadyError(failed.detail, reason=f"precheck_{failed.name}")
    return PrecheckResult(
        codex_version=report.codex_version, image_id=report.image_id, checks_passed=len(report.checks)
    )
