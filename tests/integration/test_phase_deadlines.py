"""The deadlines of extract and baseline (``--extract-timeout``, issue 24), provoked for real.

A hung extract: the real engine's ``get_archive`` answer passes through ``tests/docker_proxy.py``,
which stops forwarding it mid-stream (a daemon stopped or hung: the read blocks, docker-py has
turned the socket's timeout off) or forwards it so slowly that it never ends in time (a stream
that keeps sending bytes). No image can make the engine stream for ever by itself: a large sparse
file is written out in full when its layer is committed (a 2 GiB one took 31 s to build and 2 GiB
of the daemon's disk), and a FIFO or device is one header, refused by the extractor.
A hung baseline: a ``git`` earlier on PATH that hangs in ``git add`` (a real git cannot hang on demand).
Each ends at its deadline, exit 3, an infrastructure failure naming the phase, nothing left behind;
the rerun does the phase again and completes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from reducers.outcome import TaskState, task_facts
from runner.jobroot import written_run
from tests.conftest import (
    FAKE_CODEX,
    git_processes_of,
    hanging_git_dir,
    log_events,
    make_job_root,
    read_json,
    run_cli,
    runner_containers,
    stub_args,
)
from tests.docker_proxy import CuttableDockerProxy

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]

DEADLINE = 3


def _big_args(job: Path, image: str, *extra: str) -> list[str]:
    return ["--job-root", str(job), "--tag", "big", "--image", image, "--codex-bin", str(FAKE_CODEX),
            "--source-dir", "/app/big", *extra]


def _assert_an_infrastructure_timeout(job: Path, phase: str, code: int, stderr: str, docker_client) -> None:
    assert code == 3, stderr[-3000:]
    marker = read_json(job / "result-markers" / f"{phase}.json")
    assert marker["status"] == "failed" and marker["reason"] == f"{phase}_timeout", marker
    assert f"{phase}: the {phase} phase passed its deadline of {DEADLINE}s (--extract-timeout)" in stderr
    run = written_run(job)
    assert run is not None
    assert run.first_failed_phase == phase and run.first_failure_reason == f"{phase}_timeout"
    assert run.failure_attribution_labels == [f"failed_{phase}_{phase}_timeout"]
    facts = task_facts(run, code, 1.0)
    assert facts.state is TaskState.FAILED and facts.infra_failure is True and not facts.scored
    assert runner_containers(docker_client) == []


@pytest.mark.parametrize("how", ["stalled", "dripping"])
def test_a_hung_archive_stream_ends_at_the_extract_deadline(
    tmp_path: Path, hostile_image: str, docker_client, how: str
) -> None:
    """150 MB of the hostile image's big tree: the daemon stops after 4 MiB, or sends 320 kB/s."""
    job = make_job_root(tmp_path, "fake-codex-mode: no-change\n")
    if how == "stalled":
        proxy = CuttableDockerProxy(stall_on=b"/archive", stall_after=4 << 20)
    else:
        proxy = CuttableDockerProxy(drip_on=b"/archive", drip_bytes=16384, drip_seconds=0.05)
    started = time.monotonic()
    try:
        done = run_cli("--execute", *_big_args(job, hostile_image, "--extract-timeout", str(DEADLINE)),
                       env={"DOCKER_HOST": proxy.docker_host}, timeout=120)
    finally:
        proxy.close()
    took = time.monotonic() - started
    assert (proxy.stalled if how == "stalled" else proxy.dripping).is_set(), "the stream was never slowed"
    _assert_an_infrastructure_timeout(job, "extract", done.returncode, done.stderr, docker_client)
    # Ended by its deadline: not by docker-py (no timeout on a stream), nor after the whole tree.
    assert took < 25, f"the run took {took:.1f}s"
    (ended,) = log_events(done.stderr, "phase_deadline_reached")
    assert ended["phase"] == "extract" and ended["deadline_seconds"] == DEADLINE
    assert not (job / "buggy-source").exists() and not list(job.glob(".buggy-source.partial*"))
    assert not (job / ".baseline.git").exists()
    assert not (job / "patches").exists() or not list((job / "patches").iterdir())
    # The engine answers again: the rerun extracts the whole tree and goes on.
    again = run_cli("--execute", *_big_args(job, hostile_image), timeout=300)
    extract = read_json(job / "result-markers" / "extract.json")
    assert extract["status"] == "ok" and extract["details"]["file_count"] == 20001, again.stderr[-3000:]
    assert read_json(job / "result-markers" / "baseline.json")["status"] == "ok"



def test_a_hung_git_ends_at_the_baseline_deadline(tmp_path: Path, stub_image: str, docker_client) -> None:
    job = make_job_root(tmp_path)
    path = f"{hanging_git_dir(tmp_path)}{os.pathsep}{os.environ.get('PATH', '')}"
    started = time.monotonic()
    done = run_cli("--execute", *stub_args(job, stub_image, "--extract-timeout", str(DEADLINE)),
                   env={"PATH": path}, timeout=120)
    took = time.monotonic() - started
    _assert_an_infrastructure_timeout(job, "baseline", done.returncode, done.stderr, docker_client)
    assert took < 60, f"the run took {took:.1f}s"
    assert read_json(job / "result-markers" / "extract.json")["status"] == "ok"  # its own deadline, kept
    assert git_processes_of(job) == [] and not (job / ".baseline.git").exists()
    # The rerun resumes at baseline with a git that works, and completes.
    again = run_cli("--execute", *stub_args(job, stub_image), timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert read_json(job / "result-markers" / "baseline.json")["status"] == "ok"
    assert read_json(job / "benchmark_run.compact.json")["official_task_score"]["resolved"] is True
