"""evaluate: the patch, applied and tested in a fresh container of the extracted image.

Invariants:
- the container runs the image the source came from (by id), with its own Env
  and WorkingDir; only its entrypoint is replaced, by a gate that runs the apply
  command and, only when it succeeds, the test command in its place, as the
  official evaluation's ``apply && test`` does;
- the patch goes in on the container's stdin (the attach that reads its output, as
  ``docker run -i`` does): the gate writes it to its path and checks its size before
  apply runs; where that cannot work (a transport that cannot half-close, an image whose
  user cannot create the path), by ``put_archive`` in a fresh container instead. No host
  directory is mounted;
- only the official evaluation's placeholder credentials are set, never the host's;
- stdout and stderr stay apart all the way (the container has no TTY, so the
  attach demultiplexes them), because the official verdict reads stdout alone;
- resolved = the official score (``runner.verdict.official_verdict``): the
  container's exit code, from the daemon, is 0 (the gate exits non-zero when
  apply fails, so 0 means apply 0 and test 0), ``FAILED`` is not in stdout and a
  success string is. The official command's stdout is apply's followed by the
  test's, so both are read, in that order. The exit-code verdict is kept beside
  it as its own field, and a disagreement is flagged;
- the gate reports apply's own exit code on a line tagged with a per-run nonce,
  on both streams, before the test starts; that only splits the records (the
  line is in no log), it never decides a verdict;
- for a tag whose profile needs the network, a probe through the same network
  mode, run beside the evaluation and awaited before the verdict, records whether
  a container reaches the package index (or every endpoint ``--eval-probe``
  declares instead), which it tried, and whether the answer was the host's of less
  than a minute ago (``runner.network_probe``); such a tag evaluated without the
  network is ``verdict_untrusted``. A tag that needs none is not probed;
- one deadline (``--eval-timeout``) covers apply and test; past it the
  container is killed; it is always removed.
"""

from __future__ import annotations

import io
import secrets
import tarfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

import docker
import structlog
from docker.errors import DockerException
from requests.exceptions import RequestException

from reducers.models import EvaluateResult, Phase
from runner.atomic import open_private
from runner.context import JobContext, sha256_file
from runner.docker_utils import (
    LABEL_PHASE,
    NO_LOG_DRIVER,
    ProcessOutcome,
    copy_in,
    managed_container,
    pumping_output,
    run_main_process,
    stdin_attach_supported,
)
from runner.errors import PhaseError
from runner.journal import default_state_dir
from runner.network_probe import NETWORK_PROBE_PHASE, probe_memory, probe_once
from runner.settings import PATCH_IN_CONTAINER
from runner.verdict import official_verdict, string_verdict

log = structlog.get_logger(__name__)

# The placeholders AgentIssue-Bench's eval_patches.py sets; real host values never go in.
PLACEHOLDER_ENV = {"OPENAI_API_KEY": "api-key", "OPENAI_API_BASE": "api-base-url"}
# The container's own process: apply, then a status line (on stdout and on stderr, so that
# each stream can be split at it), then the test in the gate's place. Neither stream is joined
# to the other. One process and no exec, signal or poll, which keeps the overhead near
# `docker run --rm`'s. The nonce ($3) is made after codex has ended and is gone from the
# process table once the test replaces the gate, so neither the patch nor the code under test
# can write a status line the runner takes. First, when the patch comes on stdin ($5 its size,
# else "-"), it is written to its path ($4) and its size checked, silently: a patch that did not
# arrive whole ends the gate with NOT_DELIVERED_EXIT before apply runs, and no status line.
APPLY_STATUS = "runner-apply-exit"
NOT_DELIVERED_EXIT = 197
GATE_SCRIPT = (
    'if [ "$5" != - ]; then { mkdir -p "${4%/*}" && cat > "$4" && [ "$(wc -c < "$4")" -eq "$5" ]; } '
    '>/dev/null 2>&1 || exit ' + str(NOT_DELIVERED_EXIT) + '; fi; exec </dev/null; '
    'bash -c "$1"; status=$?; echo "' + APPLY_STATUS + ':$3:$status"; '
    'echo "' + APPLY_STATUS + ':$3:$status" >&2; '
    '[ "$status" -eq 0 ] || exit "$status"; exec bash -c "$2"'
)
APPLY_LOG = "eval-apply.log"  # apply's stdout
TEST_LOG = "eval-test.log"  # the test's stdout
APPLY_STDERR_LOG = "eval-apply.stderr.log"
TEST_STDERR_LOG = "eval-test.stderr.log"

def _patch_archive(patch: Path | bytes) -> bytes:
    """A tar holding the patch's directory and the patch, to unpack at ``/``."""
    target = PurePosixPath(PATCH_IN_CONTAINER)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        directory = tarfile.TarInfo(str(target.parent).lstrip("/"))
        directory.type, directory.mode = tarfile.DIRTYPE, 0o755
        archive.addfile(directory)
        info = tarfile.TarInfo(str(target).lstrip("/"))
        info.mode = 0o644
        if isinstance(patch, bytes):
            info.size = len(patch)
            archive.addfile(info, io.BytesIO(patch))
        else:
            info.size = patch.stat().st_size
            with patch.open("rb") as handle:
                archive.addfile(info, handle)
    return buffer.getvalue()


class OutputSplitter:
    """Routes one output stream to the apply sink up to the gate's status line, then to the test sink.

    Any chunking works: a status line cut between chunks is still found, because a tail
    that could begin one is held back (a few dozen bytes) until the next chunk.
    """

    def __init__(self, nonce: str, apply_sink: IO[bytes], test_sink: IO[bytes]) -> None:
        self._tag = f"{APPLY_STATUS}:{nonce}:".encode()
        self._apply, self._test = apply_sink, test_sink
        self._held = b""
        self.found = False
        self.found_at: float | None = None  # time.monotonic() when the status line arrived
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
            self.found_at = time.monotonic()
            return

    def close(self) -> None:
        if not self.found:
            self._apply.write(self._held)
            self._held = b""


@dataclass(frozen=True)
class EvalSinks:
    """Where the four records go: apply and test, stdout and stderr, each its own."""

    apply_stdout: IO[bytes]
    test_stdout: IO[bytes]
    apply_stderr: IO[bytes]
    test_stderr: IO[bytes]


@dataclass(frozen=True)
class EvalRun:
    container_exit_code: int | None
    apply_exit_code: int | None
    test_exit_code: int | None
    timed_out: bool
    apply_seconds: float | None
    test_seconds: float | None

    @property
    def exit_code_verdict(self) -> bool:
        return self.container_exit_code == 0 and not self.timed_out


def _run_gate(
    client: docker.DockerClient, *, image_id: str, labels: dict[str, str], patch: Path | bytes, by_stdin: bool,
    nonce: str, apply_cmd: str, test_cmd: str, network: str, timeout: float,
    feed: Callable[[tuple[bytes | None, bytes | None]], None],
) -> ProcessOutcome:
    """One container of the gate, the patch in by stdin or by ``put_archive``, its output to ``feed``."""
    size = str(len(patch) if isinstance(patch, bytes) else patch.stat().st_size) if by_stdin else "-"
    with managed_container(
        client,
        image=image_id,
        labels=labels,
        entrypoint=["/bin/sh", "-c", GATE_SCRIPT, "runner-gate", apply_cmd, test_cmd, nonce, PATCH_IN_CONTAINER, size],
        command=[],
        environment=PLACEHOLDER_ENV,
        network_mode=network,
        log_config=NO_LOG_DRIVER,
        stdin_open=by_stdin,
    ) as container:
        if not by_stdin:
            copy_in(container, "/", _patch_archive(patch))
        with pumping_output(container, feed, demux=True, stdin=patch if by_stdin else None):
            return run_main_process(
                container, timeout=timeout, on_start=lambda: log.info("evaluate_container_started", timeout_seconds=timeout)
            )


def run_apply_and_test(
    client: docker.DockerClient,
    *,
    image_id: str,
    labels: dict[str, str],
    patch: Path | bytes,
    apply_cmd: str,
    test_cmd: str,
    network: str,
    timeout: float,
    sinks: EvalSinks,
) -> EvalRun:
    """One evaluation container: the patch in, the gate run, the four records out, the container removed.

    The one container mechanism of the runner's evaluations (the evaluate phase and the audit).

    Raises:
        ImageMissingError: the image is gone. DockerException: the daemon failed.
    """
    nonce = secrets.token_hex(16)
    out = OutputSplitter(nonce, sinks.apply_stdout, sinks.test_stdout)
    err = OutputSplitter(nonce, sinks.apply_stderr, sinks.test_stderr)

    def feed(pair: tuple[bytes | None, bytes | None]) -> None:
        stdout, stderr = pair
        if stdout:
            out.feed(stdout)
        if stderr:
            err.feed(stderr)

    deadline = time.monotonic() + timeout
    by_stdin = stdin_attach_supported(client)
    while True:
        ended = _run_gate(client, image_id=image_id, labels=labels, patch=patch, by_stdin=by_stdin, nonce=nonce,
                          apply_cmd=apply_cmd, test_cmd=test_cmd, network=network,
                          timeout=max(1.0, deadline - time.monotonic()), feed=feed)
        not_delivered = (by_stdin and not ended.timed_out and ended.exit_code == NOT_DELIVERED_EXIT
                         and not out.found)
        if not not_delivered:
            break
        # The gate wrote nothing to either stream before it gave up: the sinks are still empty.
        log.warning("patch_not_taken_on_stdin", action="evaluated again with the patch put in by put_archive")
        by_stdin = False
    started, finished = ended.started, ended.finished
    out.close()
    err.close()
    container_exit, timed_out = ended.exit_code, ended.timed_out
    # Exit 0 is only reachable through a successful apply; otherwise the gate's line says which failed.
    apply_exit = 0 if container_exit == 0 and not timed_out else out.apply_status
    test_exit = container_exit if apply_exit == 0 and not timed_out else None
    split_at = out.found_at
    return EvalRun(
        container_exit_code=container_exit,
        apply_exit_code=apply_exit,
        test_exit_code=test_exit,
        timed_out=timed_out,
        apply_seconds=round((split_at if split_at is not None else finished) - started, 3),
        test_seconds=round(finished - split_at, 3) if split_at is not None else None,
    )


def evaluate(ctx: JobContext, image_id: str) -> EvaluateResult:
    """Raises: ImageMissingError when the image is gone; PhaseError when the patch is missing."""
    settings, job = ctx.settings, ctx.job
    if not job.patch.is_file():
        raise PhaseError("evaluate", "patch_missing", f"{job.relative(job.patch)} is missing; rerun the patch phase")
    client = ctx.docker()
    network = settings.eval_network.value
    profile = settings.profile
    needs_network = bool(profile and profile.needs_network)
    logs = {name: job.logs / name for name in (APPLY_LOG, TEST_LOG, APPLY_STDERR_LOG, TEST_STDERR_LOG)}
    # The probe runs beside the evaluation, in its own container (its own phase label, so that a
    # half-made container of one is never taken for the other): its answer is in hand before the
    # verdict is recorded, and a blackholed network costs no wall time.
    probe_labels = {**ctx.labels(Phase.EVALUATE), LABEL_PHASE: NETWORK_PROBE_PHASE}
    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="network-probe") as pool,
        open_private(logs[APPLY_LOG]) as apply_out,  # truncated, and never a link the agent planted
        open_private(logs[TEST_LOG]) as test_out,
        open_private(logs[APPLY_STDERR_LOG]) as apply_err,
        open_private(logs[TEST_STDERR_LOG]) as test_err,
    ):
        patch_sha256 = sha256_file(job.patch)  # only the runner writes Patches/ once codex has ended
        memory = probe_memory(settings.state_dir or default_state_dir())
        probing = pool.submit(probe_once, client, memory, needs_network=needs_network, image_id=image_id,
                              network=network, labels=probe_labels, endpoints=settings.probe_endpoints)
        run = run_apply_and_test(
            client,
            image_id=image_id,
            labels=ctx.labels(Phase.EVALUATE),
            patch=job.patch,
            apply_cmd=settings.apply_cmd,
            test_cmd=settings.test_cmd,
            network=network,
            timeout=settings.eval_timeout,
            sinks=EvalSinks(apply_out, test_out, apply_err, test_err),
        )
        probe = probing.result()
    log.info("network_probed", network=network, reachable=probe.reachable, detail=probe.detail,
             endpoints=list(probe.endpoints), unreached=probe.unreached, remembered=probe.remembered)
    stdout_logs = [logs[APPLY_LOG], logs[TEST_LOG]]  # the official command's stdout, in order
    by_exit = run.exit_code_verdict
    by_strings = string_verdict(stdout_logs)
    official = official_verdict(None if run.timed_out else run.container_exit_code, stdout_logs)
    untrusted = needs_network and probe.reachable is not True
    log.info("evaluate_finished", apply_exit_code=run.apply_exit_code, test_exit_code=run.test_exit_code,
             timed_out=run.timed_out, resolved=official, exit_code_verdict=by_exit, verdict_untrusted=untrusted)
    return EvaluateResult(
        exit_code=run.test_exit_code,
        reason="eval_timeout" if run.timed_out else "ok",
        image_id=image_id,
        network=network,
        apply_exit_code=run.apply_exit_code,
        test_exit_code=run.test_exit_code,
        timed_out=run.timed_out,
        resolved=official,
        exit_code_verdict=by_exit,
        string_verdict=by_strings,
        verdicts_disagree=by_exit != by_strings,  # covers exit 0 with the official rule failing
        apply_seconds=run.apply_seconds,
        test_seconds=run.test_seconds,
        network_reachable=probe.reachable,
        network_probe=probe.detail,
        network_probed=list(probe.endpoints),
        network_probe_remembered=probe.remembered,
        needs_network=needs_network,
        verdict_untrusted=untrusted,
        apply_log_sha256=sha256_file(logs[APPLY_LOG]),
        test_log_sha256=sha256_file(logs[TEST_LOG]),
        apply_stderr_log_sha256=sha256_file(logs[APPLY_STDERR_LOG]),
        test_stderr_log_sha256=sha256_file(logs[TEST_STDERR_LOG]),
        patch_sha256=patch_sha256,
    )
