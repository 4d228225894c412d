"""evaluate: the patch, applied and tested in a fresh container of the extracted image.

Invariants:
- the container runs the image the source came from (by id), with its own Env
  and WorkingDir; only its entrypoint is replaced, by a gate that runs the test
  command as the container's own process once the apply command (an exec in the
  same container) has succeeded;
- the patch goes in with ``put_archive``; no host directory is mounted;
- only the official evaluation's placeholder credentials are set, never the host's;
- resolved = apply exit 0 and test exit 0, both read from the daemon (the exec's
  and the container's exit codes); the output
  strings give a second, separate verdict that never decides the first;
- one deadline (``--eval-timeout``) covers apply and test; past it the
  container is killed; it is always removed.
"""

from __future__ import annotations

import io
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import structlog
from docker.types import LogConfig

from reducers.models import Phase
from runner.atomic import open_private
from runner.context import JobContext, PhaseResult, sha256_file
from runner.docker_utils import (
    ensure_image,
    kill_quietly,
    managed_container,
    run_exec,
    save_logs,
    wait_for_output,
    wait_main_process,
)
from runner.errors import PhaseError
from runner.settings import PATCH_IN_CONTAINER
from runner.verdict import string_verdict

log = structlog.get_logger(__name__)

# The placeholders AgentIssue-Bench's eval_patches.py sets; real host values never go in.
PLACEHOLDER_ENV = {"OPENAI_API_KEY": "api-key", "OPENAI_API_BASE": "api-base-url"}
# The container's own process waits at this gate, runs the test command when the runner
# sends SIGUSR1 (after the apply command ran by exec), or exits on SIGUSR2. So the test's
# exit code is the container's own, from the daemon, and the container ends by itself:
# one exec and no kill, which keeps the overhead near `docker run --rm`'s.
GATE_READY = "runner-gate-ready"
GATE_SCRIPT = (
    'trap "go=run" USR1; trap "go=skip" USR2; echo ' + GATE_READY + " >&2; "
    'while [ -z "$go" ]; do sleep 1 & wait $!; done; kill $! 2>/dev/null; '
    '[ "$go" = run ] || exit 0; exec bash -c "$1"'
)
# The daemon's default log driver may not keep output; json-file does, bounded.
LOG_CONFIG = LogConfig(type=LogConfig.types.JSON, config={"max-size": "256m", "max-file": "1"})
APPLY_LOG = "eval-apply.log"
TEST_LOG = "eval-test.log"


@dataclass(frozen=True)
class EvaluateResult(PhaseResult):
    phase = Phase.EVALUATE
    image_id: str = ""
    network: str = ""
    apply_exit_code: int | None = None
    test_exit_code: int | None = None
    timed_out: bool = False
    resolved: bool = False
    string_verdict: bool = False
    verdicts_disagree: bool = False
    apply_log_sha256: str = ""
    test_log_sha256: str = ""


def _patch_archive(patch: Path) -> bytes:
    """A tar holding the patch's directory and the patch, to unpack at ``/``."""
    target = PurePosixPath(PATCH_IN_CONTAINER)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        directory = tarfile.TarInfo(str(target.parent).lstrip("/"))
        directory.type, directory.mode = tarfile.DIRTYPE, 0o755
        archive.addfile(directory)
        info = tarfile.TarInfo(str(target).lstrip("/"))
        info.size, info.mode = patch.stat().st_size, 0o644
        with patch.open("rb") as handle:
            archive.addfile(info, handle)
    return buffer.getvalue()


def evaluate(ctx: JobContext, image_id: str) -> EvaluateResult:
    """Raises: EnvironmentNotReadyError when the image is gone; PhaseError when the patch is missing."""
    settings, job = ctx.settings, ctx.job
    if not job.patch.is_file():
        raise PhaseError("evaluate", "patch_missing", f"{job.relative(job.patch)} is missing; rerun the patch phase")
    client = ctx.docker()
    ensure_image(client, image_id, allow_pull=False)
    apply_log, test_log = job.logs / APPLY_LOG, job.logs / TEST_LOG
    for path in (apply_log, test_log):
        open_private(path).close()  # truncated, and never a link the agent planted
    test_exit: int | None = None
    with managed_container(
        client,
        image=image_id,
        labels=ctx.labels(Phase.EVALUATE),
        entrypoint=["/bin/sh", "-c", GATE_SCRIPT, "runner-gate", settings.test_cmd],
        command=[],
        environment=PLACEHOLDER_ENV,
        network_mode=settings.eval_network.value,
        log_config=LOG_CONFIG,
    ) as container:
        container.put_archive("/", _patch_archive(job.patch))
        container.start()
        deadline = time.monotonic() + settings.eval_timeout
        applied = run_exec(container, ["bash", "-c", settings.apply_cmd], deadline=deadline, log_path=apply_log)
        log.info("patch_apply_finished", exit_code=applied.exit_code, timed_out=applied.timed_out)
        timed_out = applied.timed_out
        if applied.exit_code == 0 and wait_for_output(container, GATE_READY, deadline=deadline):
            kill_quietly(container, "SIGUSR1")  # gone already? then its exit code says why
            tested = wait_main_process(container, deadline=deadline)
            log.info("test_finished", exit_code=tested.exit_code, timed_out=tested.timed_out)
            test_exit, timed_out = tested.exit_code, tested.timed_out
        elif applied.exit_code == 0:
            timed_out = True  # the gate never opened before the deadline
        elif not timed_out:
            kill_quietly(container, "SIGUSR2")  # nothing to test: let it end by itself
        save_logs(container, test_log)
    resolved = applied.exit_code == 0 and test_exit == 0 and not timed_out
    by_strings = string_verdict([apply_log, test_log])
    return EvaluateResult(
        exit_code=test_exit,
        reason="eval_timeout" if timed_out else "ok",
        image_id=image_id,
        network=settings.eval_network.value,
        apply_exit_code=applied.exit_code,
        test_exit_code=test_exit,
        timed_out=timed_out,
        resolved=resolved,
        string_verdict=by_strings,
        verdicts_disagree=by_strings != resolved,
        apply_log_sha256=sha256_file(apply_log),
        test_log_sha256=sha256_file(test_log),
    )
