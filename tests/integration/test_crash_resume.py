"""Resume and crash faults: every crash resumes cleanly, and nothing of a dead run lives on.

Each test kills the runner (SIGKILL, or a signal at a chosen phase) for real, then
reruns the same command, and asserts the rerun's outcome, that no process of the
agent or of the runner's git is left, that no runner container is left (the
fixture), and that nothing outside the job root changed.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import (
    FAKE_CODEX,
    RunningCli,
    agent_gone,
    git_processes_of,
    log_events,
    make_job_root,
    read_json,
    run_cli,
    runner_containers,
    snapshot_outside,
    stub_args,
)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]


def _marker(job: Path, phase: str) -> dict:
    return read_json(job / "result-markers" / f"{phase}.json")


def _resolved(job: Path) -> bool:
    return read_json(job / "benchmark_run.compact.json")["official_task_score"]["resolved"]


def test_kill_9_during_codex_leaves_no_agent_writing_into_the_rerun(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path, "fake-codex-mode: late-writer\n")
    before = snapshot_outside(tmp_path, job)
    running = RunningCli("--execute", *stub_args(job, stub_image))
    running.wait_for_file(job / "buggy-source" / "late.started")
    running.process.kill()
    running.finish()
    assert agent_gone(job / "buggy-source", seconds=5), "the dead run's agent is still alive"
    (job / "buggy-source" / "late.txt").unlink(missing_ok=True)
    (job / "buggy-source" / "late.started").unlink()
    (job / "context" / "prompt.md").write_text("fake-codex-mode: fix\n")
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert done.returncode == 0, done.stderr
    assert _resolved(job)
    patch = (job / "Patches" / "stub_calc" / "attempt.patch").read_text()
    assert "late.txt" not in patch and not (job / "buggy-source" / "late.txt").exists()
    assert snapshot_outside(tmp_path, job) == before


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_during_baseline_leaves_no_git_and_the_rerun_resumes(
    tmp_path: Path, hostile_image: str, signum: int
) -> None:
    job = make_job_root(tmp_path)
    args = ["--job-root", str(job), "--tag", "big", "--image", hostile_image,
            "--codex-bin", str(FAKE_CODEX), "--source-dir", "/app/big"]
    running = RunningCli("--execute", *args)
    running.wait_for("phase_started", phase="baseline", timeout=300)
    time.sleep(0.3)  # `git add --all` of 20,001 files and a 150 MB blob is under way
    running.process.send_signal(signum)
    code, _, stderr = running.finish()
    assert code == 130, stderr
    assert git_processes_of(job) == [], "a git of the runner outlived it"
    done = run_cli("--execute", *args)
    assert _marker(job, "baseline")["status"] == "ok", done.stderr
    assert _marker(job, "codex")["status"] == "failed"  # the stub's fix does not fit this tree: fine


def test_kill_9_of_the_runner_leaves_no_git(tmp_path: Path, hostile_image: str) -> None:
    job = make_job_root(tmp_path)
    args = ["--job-root", str(job), "--tag", "big", "--image", hostile_image,
            "--codex-bin", str(FAKE_CODEX), "--source-dir", "/app/big"]
    running = RunningCli("--execute", *args)
    running.wait_for("phase_started", phase="baseline", timeout=300)
    time.sleep(0.3)
    running.process.kill()
    running.finish()
    deadline = time.monotonic() + 5
    while git_processes_of(job) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert git_processes_of(job) == [], "a git of the runner outlived its SIGKILL"


def test_a_stale_baseline_lock_of_a_dead_git_is_recovered(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path, "fake-codex-mode: fail\n")
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert _marker(job, "codex")["status"] == "failed", done.stderr
    # What a git killed together with its runner (an OOM or cgroup kill) leaves behind.
    (job / ".baseline.git" / "index.lock").write_text("")
    (job / "context" / "prompt.md").write_text("fake-codex-mode: fix\n")
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert done.returncode == 0, done.stderr
    assert _resolved(job)
    assert not (job / ".baseline.git" / "index.lock").exists()


def test_kill_9_between_placing_the_tree_and_its_marker_resumes(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path)
    before = snapshot_outside(tmp_path, job)
    crashed = run_cli("--execute", *stub_args(job, stub_image), env={"RUNNER_CRASH_AT": "extract-placed"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert (job / "buggy-source" / "calc").is_dir() and not (job / "result-markers" / "extract.json").exists()
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert done.returncode == 0, done.stderr
    assert [e["level"] for e in log_events(done.stderr, "unrecorded_extraction_removed")] == ["warning"]
    assert _resolved(job)
    assert snapshot_outside(tmp_path, job) == before


def test_a_copied_job_root_gets_its_own_id_and_never_sweeps_the_originals_container(
    tmp_path: Path, stub_image: str, docker_client
) -> None:
    original = make_job_root(tmp_path / "a")
    slow_test = "sleep 8 && /usr/local/bin/run_test_entrypoint.sh test_patched"
    running = RunningCli("--execute", *stub_args(original, stub_image, "--test-cmd", slow_test))
    running.wait_for("evaluate_container_started")
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(original), str(copy)], check=True)
    done = run_cli("--execute", *stub_args(copy, stub_image, "--test-cmd", slow_test))
    code, _, stderr = running.finish()
    assert code == 0, stderr
    assert _resolved(original), "the copy's sweep took the original's evaluation container"
    assert len(log_events(done.stderr, "job_root_copy_detected")) == 1
    assert (copy / ".runner-job-id").read_text() != (original / ".runner-job-id").read_text()
    assert runner_containers(docker_client) == []


def test_a_source_replaced_by_a_link_outside_the_job_root_is_refused(tmp_path: Path, stub_image: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "host-secret.txt").write_text("host file contents\n")
    job = make_job_root(tmp_path, f"fake-codex-mode: swap-source\nfake-codex-swap-target: {outside}\n")
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert done.returncode == 1, done.stderr
    assert _marker(job, "codex")["reason"] == "codex_replaced_source"
    assert not _resolved(job)
    assert not (job / "Patches" / "stub_calc" / "attempt.patch").exists()
    assert not (job / "result-markers" / "evaluate.json").exists()
    done = run_cli("--execute", *stub_args(job, stub_image))  # and a rerun does not take it either
    assert done.returncode != 0 and not _resolved(job)
    assert not (job / "Patches" / "stub_calc" / "attempt.patch").exists()
    shutil.rmtree(outside)
