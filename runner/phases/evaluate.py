"""evaluate: the patch, applied and tested in a fresh container of the extracted image.

Invariants:
- the container runs the image the source came from (by id), with its own Env
  and WorkingDir; only its entrypoint is replaced, by a gate that runs the apply
  command and, only when it succeeds, the test command in its place, as the
  official evaluation's ``apply && test`` does;
- the patch goes in with ``put_archive``; no host directory is mounted;
- only the official evaluation's placeholder credentials are set, never the host's;
- resolved = the container's exit code, from the daemon, is 0: the gate exits
  non-zero when apply fails, so 0 means apply 0 and test 0. The gate reports
  apply's own exit code on a line tagged with a per-run nonce, before the test
  starts; that only splits the record and the logs, it never decides the verdict.
  The output strings give a second, separate verdict that never decides the first;
- one deadline (``--eval-timeout``) covers apply and test; past it the
  container is killed; it is always removed.
"""

from __future__ import annotations

import io
import secrets
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

import structlog
from docker.types import LogConfig

from reducers.models import Phase
from runner.atomic import open_private
from runner.context import JobContext, PhaseResult, sha256_file
from runner.docker_utils import managed_container, pumping_output, wait_main_process
from runner.errors import PhaseError
from runner.settings import PATCH_IN_CONTAINER
from runner.verdict import string_verdict

log = structlog.get_logger(__name__)

# The placeholders AgentIssue-Bench's eval_patches.py sets; real host values never go in.
PLACEHOLDER_ENV = {"OPENAI_API_KEY": "api-key", "OPENAI_API_BASE": "api-base-url"}
# The container's own process: apply, then a status line, then the test in the gate's place,
# each with stderr joined to stdout so that the output keeps its order around the line. One
# process and no exec, signal or poll, which keeps the overhead near `docker run --rm`'s.
# The nonce ($3) is made after codex has ended and is gone from the process table once the
# test replaces the gate, so neither the patch nor the code under test can write a status
# line the runner takes.
APPLY_STATUS = "runner-apply-exit"
GATE_SCRIPT = (
    'bash -c "$1" 2>&1; status=$?; echo "' + APPLY_STATUS + ':$3:$status"; '
    '[ "$status" -eq 0 ] || exit "$status"; exec bash -c "$2" 2>&1'
)
# The output is read through an attach while the container runs; a log driver would only
# keep a second, capped copy on the daemon's disk.
NO_LOG_DRIVER = LogConfig(type=LogConfig.types.NONE)
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
    patch_sha256: str = ""  # the patch this verdict belongs to: a resume re-evaluates any other


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


class OutputSplitter:
    """Routes the container's output to the apply log up to the gate's status line, then to the test log.

    Any chunking works: a status line cut between chunks is still found, because a tail
    that could begin one is held back (a few dozen bytes) until the next chunk.
    """

    def __init__(self, nonce: str, apply_sink: IO[bytes], test_sink: IO[bytes]) -> None:
        self._tag = f"{APPLY_STATUS}:{nonce}:".encode()
        self._apply, self._test = apply_sink, test_sink
        self._held = b""
        self.found = False
        self.apply_status: int | None = None

    def feed(self, chunk: bytes) -> None:
        if self.found:
            self._test.write(chunk)
            return
        data = self._held + chunk
        while True:
            at = data.find(self._tag)
            if at < 0:
                keep = min(len(data), len(self._tag) - 1)  # could be the start of the tag
                self._apply.write(data[: len(data) - keep])
                self._held = data[len(data) - keep :]
                return
            self._apply.write(data[:at])
            data = data[at:]
            rest = data[len(self._tag) :]
            end = rest.find(b"\n")
            digits = rest if end < 0 else rest[:end]
            plausible = len(digits) <= 3 and (digits == b"" or digits.isdigit())
            if plausible and end < 0:
                self._held = data  # the status line, not complete yet
                return
            if not plausible or digits == b"":
                self._apply.write(data[:1])  # not a status line: look further on
                data = data[1:]
                continue
            self._test.write(rest[end + 1 :])
            self._held, self.found, self.apply_status = b"", True, int(digits)
            return

    def close(self) -> None:
        if not self.found:
            self._apply.write(self._held)
            self._held = b""


def evaluate(ctx: JobContext, image_id: str) -> EvaluateResult:
    """Raises: ImageMissingError when the image is gone; PhaseError when the patch is missing."""
    settings, job = ctx.settings, ctx.job
    if not job.patch.is_file():
        raise PhaseError("evaluate", "patch_missing", f"{job.relative(job.patch)} is missing; rerun the patch phase")
    client = ctx.docker()
    apply_log, test_log = job.logs / APPLY_LOG, job.logs / TEST_LOG
    nonce = secrets.token_hex(16)
    with (
        open_private(apply_log) as apply_sink,  # truncated, and never a link the agent planted
        open_private(test_log) as test_sink,
        managed_container(
            client,
            image=image_id,
            labels=ctx.labels(Phase.EVALUATE),
            entrypoint=["/bin/sh", "-c", GATE_SCRIPT, "runner-gate", settings.apply_cmd, settings.test_cmd, nonce],
            command=[],
            environment=PLACEHOLDER_ENV,
            network_mode=settings.eval_network.value,
            log_config=NO_LOG_DRIVER,
        ) as container,
    ):
        patch_sha256 = sha256_file(job.patch)  # only the runner writes Patches/ once codex has ended
        container.put_archive("/", _patch_archive(job.patch))
        splitter = OutputSplitter(nonce, apply_sink, test_sink)
        with pumping_output(container, splitter.feed):
            container.start()
            log.info("evaluate_container_started", timeout_seconds=settings.eval_timeout)
            ended = wait_main_process(container, deadline=time.monotonic() + settings.eval_timeout)
        splitter.close()
    container_exit, timed_out = ended.exit_code, ended.timed_out
    # Exit 0 is only reachable through a successful apply; otherwise the gate's line says which failed.
    apply_exit = 0 if container_exit == 0 and not timed_out else splitter.apply_status
    test_exit = container_exit if apply_exit == 0 and not timed_out else None
    resolved = container_exit == 0 and not timed_out
    log.info("evaluate_finished", apply_exit_code=apply_exit, test_exit_code=test_exit, timed_out=timed_out)
    by_strings = string_verdict([apply_log, test_log])
    return EvaluateResult(
        exit_code=test_exit,
        reason="eval_timeout" if timed_out else "ok",
        image_id=image_id,
        network=settings.eval_network.value,
        apply_exit_code=apply_exit,
        test_exit_code=test_exit,
        timed_out=timed_out,
        resolved=resolved,
        string_verdict=by_strings,
        verdicts_disagree=by_strings != resolved,
        apply_log_sha256=sha256_file(apply_log),
        test_log_sha256=sha256_file(test_log),
        patch_sha256=patch_sha256,
    )
