"""A batch or a reader that goes away mid-run: the tasks still end cleanly and a rerun resumes them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import (
    FAKE_CODEX,
    REPO,
    RunningCli,
    cli_environment,
    make_job_root,
    read_json,
    runner_containers,
    stub_args,
    wait_dead,
)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]


def _jobs(tmp_path: Path, tags: list[str], prompt: str) -> Path:
    jobs = tmp_path / "jobs"
    for tag in tags:
        (jobs / tag / "context").mkdir(parents=True)
        (jobs / tag / "context" / "prompt.md").write_text(prompt)
    return jobs


def _batch_args(jobs: Path, image: str, tags: list[str], *extra: str) -> list[str]:
    args = ["--execute", "--jobs-dir", str(jobs), "--image", image, "--codex-bin", str(FAKE_CODEX)]
    for tag in tags:
        args += ["--tag", tag]
    return [*args, *extra]


def test_a_batch_killed_with_sigkill_leaves_tasks_that_end_cleanly_and_a_rerun_that_resumes(
    tmp_path: Path, stub_image: str, docker_client
) -> None:
    tags = ["k_0", "k_1"]
    jobs = _jobs(tmp_path, tags, "fake-codex-mode: hang\n")
    running = RunningCli(*_batch_args(jobs, stub_image, tags, "--workers", "2"))
    # Killed once both codex processes run: the batch hears of the codex phase a moment before
    # the task starts codex and logs it, and a kill in between is a different case (no codex yet).
    logs = [jobs / ".batch-logs" / f"{tag}.log" for tag in tags]
    deadline = time.monotonic() + 60
    while not all(log.exists() and '"codex_started"' in log.read_text() for log in logs):
        assert time.monotonic() < deadline, "the tasks never started codex"
        time.sleep(0.1)
    pids = [int((jobs / tag / ".runner.lock").read_text()) for tag in tags]
    running.process.kill()
    running.finish()
    # Each task got SIGTERM with its batch and took the interrupt path: no EPIPE death.
    for pid in pids:
        assert wait_dead(pid, 30), "a task outlived its batch"
    for tag in tags:
        log = (jobs / ".batch-logs" / f"{tag}.log").read_text()
        assert '"phase_started"' in log and '"codex_started"' in log, "the task's log was lost"
        assert read_json(jobs / tag / "result-markers" / "codex.json")["reason"] == "interrupted"
        assert (jobs / tag / "benchmark_run.compact.json").exists()
    assert runner_containers(docker_client) == []
    # The immediate rerun is not refused by a lock of the dead batch or its tasks, and resumes.
    for tag in tags:
        (jobs / tag / "context" / "prompt.md").write_text("fake-codex-mode: fix\n")
    again = subprocess.run(
        [sys.executable, "-m", "runner", *_batch_args(jobs, stub_image, tags, "--workers", "2")],
        cwd=REPO, env=cli_environment(None), capture_output=True, text=True, timeout=300,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads(again.stdout)
    assert summary["resolved"] == 2 and summary["states"] == {"done": 2}


def test_a_reader_that_goes_away_never_ends_the_run(tmp_path: Path, stub_image: str) -> None:
    """``python -m runner --execute ... 2>&1 | head -3``: the run goes on after head exits."""
    job = make_job_root(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-m", "runner", "--execute", *stub_args(job, stub_image)],
        cwd=REPO, env=cli_environment(None), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    assert process.stdout is not None
    for _ in range(3):
        process.stdout.readline()
    process.stdout.close()  # what head does after three lines
    assert process.wait(timeout=300) == 0
    run = read_json(job / "benchmark_run.compact.json")
    assert run["official_task_score"]["resolved"] is True
    assert read_json(job / "result-markers" / "evaluate.json")["status"] == "ok"


# From the runner's first line on (a few tens of ms after exec: the interpreter's own start-up
# is out of its hands), a signal is an interrupt; the report's cases were 0.3 s and 0.6 s.
@pytest.mark.parametrize("after", [0.3, 0.6, 1.0])
def test_an_early_sigterm_to_a_batch_is_an_interrupt_with_a_summary(
    tmp_path: Path, stub_image: str, after: float
) -> None:
    tags = ["e_0", "e_1"]
    jobs = _jobs(tmp_path, tags, "fake-codex-mode: hang\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "runner", *_batch_args(jobs, stub_image, tags, "--workers", "2")],
        cwd=REPO, env=cli_environment(None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    time.sleep(after)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-2000:]
    summary = json.loads(stdout)
    assert summary["interrupted"] is True and summary["exit_code"] == 130
    assert set(summary["states"]) <= {"cancelled"}, summary["states"]
    ledger = jobs / "run-ledger.json"
    if ledger.exists():
        assert all(row["state"] == "cancelled" for row in read_json(ledger)["rows"])


def test_an_interrupt_while_a_create_request_is_on_its_way_leaves_no_container(
    tmp_path: Path, stub_image: str, docker_client
) -> None:
    """The window behind the early-SIGTERM leak: the signal lands while the runner waits for the daemon
    to answer a create. The daemon still creates the container after the runner's cleanup has looked
    for it, so the create is never cut half-way: the interrupt waits for its answer (signals.deferred)."""
    from tests.docker_proxy import CuttableDockerProxy

    job = make_job_root(tmp_path)
    proxy = CuttableDockerProxy(hold_on=b"/containers/create", hold_seconds=2.0)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "runner", "--execute", *stub_args(job, stub_image)],
            cwd=REPO, env=cli_environment({"DOCKER_HOST": proxy.docker_host}),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert proxy.held.wait(60), "no container was created"
        time.sleep(0.3)  # the request is on its way: the client waits for the answer
        process.send_signal(signal.SIGTERM)
        _stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 130, stderr[-2000:]
        time.sleep(3)  # long after the held request reached the daemon
        assert runner_containers(docker_client) == [], "a container created during the interrupt was left"
    finally:
        proxy.close()
