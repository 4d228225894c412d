"""Faults, provoked for real: Docker, the image, codex, the evaluation, interrupts, crashes, locks, disks.

Each test asserts the exit code, an actionable message, the markers and compact
outputs, that nothing outside the job root changed, and (through the fixture)
that no container with the runner's labels is left.
"""

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
    agent_gone,
    cli_environment,
    log_events,
    make_job_root,
    mounted_tmpfs,
    read_json,
    run_cli,
    runner_containers,
    snapshot_outside,
    stub_args,
)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]

NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def _marker(job: Path, phase: str) -> dict:
    return read_json(job / "result-markers" / f"{phase}.json")


# --- Docker and the image ---------------------------------------------------------------

def test_unreachable_docker_is_reported_by_precheck_and_stops_execute(job_root: Path, stub_image: str) -> None:
    done = run_cli("--precheck", "--image", stub_image, "--codex-bin", str(FAKE_CODEX), env=NO_DOCKER)
    assert done.returncode == 3
    assert "docker_daemon" in done.stdout and "DOCKER_HOST" in done.stdout
    done = run_cli("--execute", *stub_args(job_root, stub_image), env=NO_DOCKER)
    assert done.returncode == 3, done.stderr
    assert "Docker daemon does not answer" in done.stderr and "DOCKER_HOST" in done.stderr
    assert _marker(job_root, "precheck")["status"] == "failed"
    assert not (job_root / "buggy-source").exists() and not (job_root / "result-markers" / "extract.json").exists()
    run = read_json(job_root / "benchmark_run.compact.json")
    assert run["first_failed_phase"] == "precheck"
    assert run["failure_attribution_labels"] == ["failed_precheck_precheck_docker_daemon"]


def test_missing_image_without_allow_pull_names_the_flag(job_root: Path, docker_client) -> None:
    done = run_cli("--execute", *stub_args(job_root, "agentissue-runner-absent:none"))
    assert done.returncode == 3
    assert "--allow-pull" in done.stderr
    assert read_json(job_root / "benchmark_run.compact.json")["first_failed_phase"] == "precheck"


# --- codex ------------------------------------------------------------------------------

def test_codex_not_found(job_root: Path, stub_image: str, tmp_path: Path) -> None:
    done = run_cli("--execute", *stub_args(job_root, stub_image, codex=tmp_path / "nowhere" / "codex"))
    assert done.returncode == 3
    assert "--codex-bin" in done.stderr
    run = read_json(job_root / "benchmark_run.compact.json")
    assert run["first_failed_phase"] == "precheck" and run["codex"]["invoked"] is False


def test_codex_exiting_non_zero(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path, "fake-codex-mode: fail\n")
    before = snapshot_outside(tmp_path, job)
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert done.returncode == 1
    assert "codex exited with 64" in done.stderr and "logs/codex.stderr.log" in done.stderr
    assert _marker(job, "codex")["exit_code"] == 64
    run = read_json(job / "benchmark_run.compact.json")
    assert run["failure_attribution_labels"] == ["failed_codex_codex_exit_nonzero"]
    assert run["codex"]["exit_code"] == 64
    assert snapshot_outside(tmp_path, job) == before


def test_codex_hanging_past_the_deadline_dies_with_its_grandchildren(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path, "fake-codex-mode: hang\n")
    started = time.monotonic()
    done = run_cli("--execute", *stub_args(job, stub_image, "--codex-timeout", "3"))
    assert time.monotonic() - started < 60
    assert done.returncode == 1
    assert "deadline of 3s" in done.stderr
    assert "logs/codex.stderr.log" in done.stderr  # the message names where the cause is
    marker = _marker(job, "codex")
    assert marker["reason"] == "codex_timeout" and marker["details"]["timed_out"] is True
    assert (job / "buggy-source" / "hang.pid").exists() and agent_gone(job / "buggy-source")
    assert read_json(job / "benchmark_run.compact.json")["codex"]["timed_out"] is True


# Runs the runner and prints the peak RSS (KiB) of it and everything below it: this run's alone,
# where RUSAGE_CHILDREN of the test session would hold every child the session ever waited for.
_PEAK_RSS_OF_ONE_RUN = (
    "import resource, subprocess, sys; code = subprocess.call([sys.executable, '-m', 'runner', *sys.argv[1:]]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)"
)


def test_codex_flooding_output_goes_to_the_log(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path, "fake-codex-mode: flood\nfake-codex-flood-mb: 300\n")
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS_OF_ONE_RUN, "--execute", *stub_args(job, stub_image)],
        cwd=REPO, env=cli_environment(None), capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (job / "logs" / "codex.stdout.log").stat().st_size > 300 * 1024 * 1024
    run = read_json(job / "benchmark_run.compact.json")
    assert run["official_task_score"]["resolved"] is True
    assert len(run["log_sha256"]["codex_stdout"]) == 64
    # The runner's own memory stays flat: the output never passes through it.
    peak_kib = int(done.stdout.strip().splitlines()[-1])
    assert 10 * 1024 < peak_kib < 200 * 1024, f"the run peaked at {peak_kib} KiB"


def test_codex_planting_links_in_the_logs_cannot_redirect_the_runner(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path, "fake-codex-mode: plant-links\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("host file\n")
    before = snapshot_outside(tmp_path, job)
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert done.returncode == 1, done.stderr
    assert _marker(job, "codex")["reason"] == "codex_wrote_runner_files"
    assert victim.read_text() == "host file\n"
    assert not any(p.is_symlink() for p in (job / "logs").iterdir())
    assert snapshot_outside(tmp_path, job) == before


def test_codex_writing_the_runners_files_is_caught_and_undone(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path, "fake-codex-mode: tamper\n")
    prompt = (job / "context" / "prompt.md").read_bytes()
    before = snapshot_outside(tmp_path, job)
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert done.returncode == 1
    assert "restored" in done.stderr
    assert (job / "context" / "prompt.md").read_bytes() == prompt
    assert _marker(job, "prepare")["status"] == "ok"  # a valid marker again, not the forgery
    assert _marker(job, "codex")["reason"] == "codex_wrote_runner_files"
    assert not (job / "result-markers" / "evaluate.json").exists()
    run = read_json(job / "benchmark_run.compact.json")
    assert run["official_task_score"]["resolved"] is False
    assert run["failure_attribution_labels"] == ["failed_codex_codex_wrote_runner_files"]
    assert snapshot_outside(tmp_path, job) == before


# --- evaluate ---------------------------------------------------------------------------

def test_an_image_removed_before_evaluate_is_named_and_leaves_no_container(
    tmp_path: Path, stub_image: str, docker_client
) -> None:
    import io
    import os

    doomed = f"agentissue-runner-doomed:{os.getpid()}"
    dockerfile = f"FROM {stub_image}\nLABEL io.agentissue-runner.test=doomed-{os.getpid()}\n"
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=doomed, rm=True, forcerm=True)
    try:
        job = make_job_root(tmp_path)
        assert run_cli("--execute", *stub_args(job, doomed)).returncode == 0
        (job / "result-markers" / "evaluate.json").unlink()
        docker_client.images.remove(doomed, force=True)
        done = run_cli("--execute", *stub_args(job, doomed))
    finally:
        if docker_client.images.list(name=doomed):
            docker_client.images.remove(doomed, force=True)
    assert done.returncode == 3, done.stderr
    assert "which this job root's source was extracted from, is not present locally" in done.stderr
    assert "--job-root" in done.stderr and "--allow-pull" not in done.stderr
    marker = _marker(job, "evaluate")
    assert (marker["status"], marker["reason"]) == ("failed", "image_missing")
    assert read_json(job / "benchmark_run.compact.json")["first_failed_phase"] == "evaluate"


def test_a_hanging_test_is_killed_at_the_eval_deadline(job_root: Path, stub_image: str) -> None:
    started = time.monotonic()
    done = run_cli("--execute", *stub_args(job_root, stub_image, "--test-cmd", "sleep 600", "--eval-timeout", "4"))
    assert time.monotonic() - started < 60
    assert done.returncode == 0, done.stderr
    marker = _marker(job_root, "evaluate")
    assert marker["reason"] == "eval_timeout" and marker["details"]["timed_out"] is True
    run = read_json(job_root / "benchmark_run.compact.json")
    assert run["official_task_score"]["resolved"] is False
    assert run["failure_attribution_labels"] == ["unresolved_eval_timeout"]


def test_a_test_flooding_its_output_loses_none_of_it_nor_applys_status(job_root: Path, stub_image: str) -> None:
    # More than a json-file log driver capped at 256 MB would keep: the output is read live.
    flood = 300 * 1024 * 1024
    test_cmd = f"/usr/local/bin/run_test_entrypoint.sh test_patched && head -c {flood} /dev/zero"
    done = run_cli("--execute", *stub_args(job_root, stub_image, "--test-cmd", test_cmd))
    assert done.returncode == 0, done.stderr
    run = read_json(job_root / "benchmark_run.compact.json")
    assert run["apply_exit_code"] == 0 and run["patched_exit_code"] == 0
    assert run["official_task_score"]["resolved"] is True
    test_log = job_root / "logs" / "eval-test.log"
    assert test_log.stat().st_size > flood
    assert "Patch applied successfully" in (job_root / "logs" / "eval-apply.log").read_text()
    test_log.unlink()


def test_a_failing_output_sink_is_raised_and_never_blocks_the_container(stub_image: str, docker_client) -> None:
    import errno

    from runner.docker_utils import managed_container, pumping_output, runner_labels, wait_main_process

    def full_disk(chunk: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    labels = runner_labels(job_id="sink-test", run_id="sink-test", phase="evaluate")
    with managed_container(docker_client, image=stub_image, labels=labels,
                           entrypoint=["sh", "-c", "head -c 50000000 /dev/zero"], command=[]) as container:
        with pytest.raises(OSError) as caught, pumping_output(container, full_disk):
            container.start()
            ended = wait_main_process(container, deadline=time.monotonic() + 60)
    assert caught.value.errno == errno.ENOSPC
    assert (ended.exit_code, ended.timed_out) == (0, False)  # drained: 50 MB never blocked it


def test_a_patch_that_does_not_apply_gets_its_label(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path, "fake-codex-mode: binary-change\n")
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert done.returncode == 0, done.stderr
    run = read_json(job / "benchmark_run.compact.json")
    assert run["binary_change_count"] == 1
    assert run["apply_exit_code"] not in (0, None) and run["patched_exit_code"] is None
    assert run["failure_attribution_labels"] == ["unresolved_patch_apply_failed_compact_result"]


_VERDICT_FIELDS = ("official_task_score", "apply_exit_code", "patched_exit_code", "failure_attribution_labels")


@pytest.mark.parametrize(("fix", "honest_mode", "resolved"), [("wrong", "wrong-fix", False), ("right", "fix", True)])
def test_code_under_test_cannot_forge_the_verdict(
    tmp_path: Path, stub_image: str, fix: str, honest_mode: str, resolved: bool
) -> None:
    """The forgery (success strings, a failing apply-status line for every nonce-like word, files
    where a verdict might be read) moves nothing: the verdict is the one the same fix gets
    without it, whether the fix is wrong (no forged pass) or right (no forged failure)."""
    honest = make_job_root(tmp_path / "honest", f"fake-codex-mode: {honest_mode}\n")
    assert run_cli("--execute", *stub_args(honest, stub_image)).returncode == 0
    job = make_job_root(tmp_path / "forged", f"fake-codex-mode: forge\nfake-codex-forge-fix: {fix}\n")
    before = snapshot_outside(tmp_path, job, honest)
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert done.returncode == 0, done.stderr
    test_log = (job / "logs" / "eval-test.log").read_text()
    assert "FIX CONFIRMED" in test_log and "runner-apply-exit:" in test_log  # it did try, and its lines went nowhere
    run, baseline = read_json(job / "benchmark_run.compact.json"), read_json(honest / "benchmark_run.compact.json")
    assert {k: run[k] for k in _VERDICT_FIELDS} == {k: baseline[k] for k in _VERDICT_FIELDS}
    assert run["official_task_score"]["resolved"] is resolved and run["apply_exit_code"] == 0
    assert sorted(p.name for p in (job / "result-markers").iterdir()) == sorted(
        f"{p}.json" for p in ("prepare", "precheck", "extract", "baseline", "codex", "patch", "evaluate", "reduce")
    )
    assert not list(job.rglob("test_success"))
    assert snapshot_outside(tmp_path, job, honest) == before


# --- interrupts and crashes ---------------------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_during_codex_then_resume(tmp_path: Path, stub_image: str, signum: int) -> None:
    job = make_job_root(tmp_path, "fake-codex-mode: hang\n")
    running = RunningCli("--execute", *stub_args(job, stub_image))
    running.wait_for_file(job / "buggy-source" / "hang.pid")
    running.process.send_signal(signum)
    code, _, stderr = running.finish()
    assert code == 130, stderr
    assert "run the same command again to resume" in stderr
    assert _marker(job, "codex")["reason"] == "interrupted"
    assert (job / "buggy-source" / "hang.pid").exists() and agent_gone(job / "buggy-source")
    assert read_json(job / "benchmark_run.compact.json")["failure_attribution_labels"] == ["failed_codex_interrupted"]

    extracted_at = _marker(job, "extract")["started_at"]
    (job / "buggy-source" / "hang.pid").unlink()
    (job / "context" / "prompt.md").write_text("fake-codex-mode: fix\n")
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert done.returncode == 0, done.stderr
    assert _marker(job, "extract")["started_at"] == extracted_at
    assert read_json(job / "benchmark_run.compact.json")["official_task_score"]["resolved"] is True


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_during_evaluate_removes_the_container(
    job_root: Path, stub_image: str, docker_client, signum: int
) -> None:
    running = RunningCli("--execute", *stub_args(job_root, stub_image, "--test-cmd", "sleep 600"))
    running.wait_for("evaluate_container_started")
    time.sleep(0.5)
    assert runner_containers(docker_client), "the evaluate container should be running now"
    running.process.send_signal(signum)
    code, _, stderr = running.finish()
    assert code == 130, stderr
    assert _marker(job_root, "evaluate")["reason"] == "interrupted"
    assert runner_containers(docker_client) == []
    done = run_cli("--execute", *stub_args(job_root, stub_image))
    assert done.returncode == 0, done.stderr
    assert read_json(job_root / "benchmark_run.compact.json")["official_task_score"]["resolved"] is True


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_during_extract_leaves_no_tree_and_no_container(
    job_root: Path, hostile_image: str, docker_client, signum: int
) -> None:
    args = ["--job-root", str(job_root), "--tag", "big", "--image", hostile_image,
            "--codex-bin", str(FAKE_CODEX), "--source-dir", "/app/big"]
    running = RunningCli("--execute", *args)
    running.wait_for("archive_stream_opened")
    running.process.send_signal(signum)
    code, _, stderr = running.finish()
    assert code == 130, stderr
    assert _marker(job_root, "extract")["reason"] == "interrupted"
    assert not (job_root / "buggy-source").exists()
    assert not list(job_root.glob(".buggy-source.partial*"))
    assert runner_containers(docker_client) == []
    # The rerun resumes at extract and gets the whole tree.
    done = run_cli("--execute", *args)
    assert _marker(job_root, "extract")["status"] == "ok", done.stderr
    assert _marker(job_root, "extract")["details"]["file_count"] == 20001
    assert _marker(job_root, "precheck")["started_at"] < _marker(job_root, "extract")["started_at"]


def test_an_interrupt_while_extract_commits_the_cache_baseline_leaves_no_tree_and_resumes(
    tmp_path: Path, hostile_image: str
) -> None:
    """With the cache on, extract commits the baseline itself once the tree is placed. Interrupted
    there, its recorded failure must leave no tree: the journal no longer says the tree is the
    runner's, and the rerun would refuse it as an operator's (exit 2)."""
    job = make_job_root(tmp_path, "fake-codex-mode: no-change\n")
    env = {"RUNNER_CACHE_DIR": str(tmp_path / "cache"), "RUNNER_CACHE_MAX_GB": "1"}
    args = ["--job-root", str(job), "--tag", "big", "--image", hostile_image,
            "--codex-bin", str(FAKE_CODEX), "--source-dir", "/app/big"]
    running = RunningCli("--execute", *args, env=env)
    running.wait_for_file(job / "buggy-source")  # placed: git is adding 20,000 files and 150 MB now
    running.process.send_signal(signal.SIGINT)
    code, _, stderr = running.finish()
    assert code == 130, stderr[-3000:]
    assert _marker(job, "extract")["reason"] == "interrupted"
    assert not (job / "buggy-source").exists() and not (job / ".baseline.git").exists()

    done = run_cli("--execute", *args, env=env)
    assert _marker(job, "extract")["status"] == "ok", done.stderr[-3000:]
    assert _marker(job, "extract")["details"]["file_count"] == 20001
    assert _marker(job, "baseline")["status"] == "ok"


def test_a_killed_run_leaves_strays_that_the_rerun_and_sweep_remove(
    tmp_path: Path, stub_image: str, docker_client
) -> None:
    job = make_job_root(tmp_path)
    running = RunningCli("--execute", *stub_args(job, stub_image, "--test-cmd", "sleep 600"))
    running.wait_for("evaluate_container_started")
    running.process.kill()
    running.finish()
    strays = runner_containers(docker_client)
    # The evaluation container, and the network probe beside it when the kill caught it running.
    phases = {c.labels["io.agentissue-runner.phase"] for c in strays}
    assert 1 <= len(strays) <= 2 and "evaluate" in phases and phases <= {"evaluate", "evaluate-network-probe"}
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert done.returncode == 0, done.stderr
    (swept,) = log_events(done.stderr, "stray_containers_removed")
    assert 1 <= swept["count"] <= len(strays)
    assert runner_containers(docker_client) == []
    assert read_json(job / "benchmark_run.compact.json")["official_task_score"]["resolved"] is True

    other = make_job_root(tmp_path / "second")
    running = RunningCli("--execute", *stub_args(other, stub_image, "--test-cmd", "sleep 600"))
    running.wait_for("evaluate_container_started")
    running.process.kill()
    running.finish()
    left = len(runner_containers(docker_client))
    assert 1 <= left <= 2
    swept = run_cli("--sweep")
    assert swept.returncode == 0, swept.stderr
    # A probe container whose create request the kill cut off may be rolled back by the daemon
    # between the count and the sweep (seen once in CI: 2 counted, 1 left to remove); what
    # matters is that the sweep takes every stray there is and nothing is left.
    assert 1 <= json.loads(swept.stdout)["removed"] <= left, swept.stdout
    assert runner_containers(docker_client) == []


def test_a_container_removed_while_the_sweep_inspects_it_does_not_end_the_sweep(stub_image: str, docker_client) -> None:
    """Seen in CI: a worker's start-up sweep died of a 404 for a container whose removal completed
    between the daemon's list and docker-py's inspect of each listed container."""
    import threading

    import docker

    from runner.docker_utils import LABEL_PID_START, runner_labels, sweep_strays
    from tests.docker_proxy import CuttableDockerProxy

    dead_owner = {**runner_labels(job_id="sweep-race", run_id="r", phase="evaluate"), LABEL_PID_START: "0"}
    gone, stray = (docker_client.containers.create(stub_image, command=["true"], labels=dead_owner) for _ in range(2))
    proxy = CuttableDockerProxy(hold_on=f"/containers/{gone.id}/json".encode(), hold_seconds=1.5)
    remover = threading.Thread(target=lambda: proxy.held.wait(30) and gone.remove(force=True))
    remover.start()
    try:
        removed, kept = sweep_strays(docker.DockerClient(base_url=proxy.docker_host), job_id="sweep-race")
    finally:
        remover.join()
        proxy.close()
    assert proxy.held.is_set(), "the sweep never inspected the container"
    assert (removed, kept) == (1, 0)
    assert runner_containers(docker_client) == []


def test_sweep_keeps_the_containers_of_live_runs(job_root: Path, stub_image: str, docker_client) -> None:
    running = RunningCli("--execute", *stub_args(job_root, stub_image, "--test-cmd", "sleep 600", "--eval-timeout", "20"))
    running.wait_for("evaluate_container_started")
    swept = run_cli("--sweep")
    assert '"removed": 0' in swept.stdout and '"kept_live": 0' not in swept.stdout
    running.process.send_signal(signal.SIGTERM)
    assert running.finish()[0] == 130


def test_a_second_run_on_the_same_job_root_is_refused(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path, "fake-codex-mode: hang\n")
    first = RunningCli("--execute", *stub_args(job, stub_image, "--codex-timeout", "6"))
    first.wait_for("codex_started")
    markers_before = {p.name: p.read_bytes() for p in (job / "result-markers").iterdir()}
    second = run_cli("--execute", *stub_args(job, stub_image))
    assert second.returncode == 2
    assert "another runner (pid" in second.stderr and "--job-root" in second.stderr
    assert {p.name: p.read_bytes() for p in (job / "result-markers").iterdir()} == markers_before
    code, _, stderr = first.finish()
    assert code == 1 and _marker(job, "codex")["reason"] == "codex_timeout", stderr
    assert (job / "real-result.public.json").exists()


# --- disks --------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path: Path):
    with mounted_tmpfs(tmp_path / "disk", "2m") as mount:
        yield mount


def _no_half_written_files(job: Path) -> None:
    assert not list(job.rglob("*.tmp"))
    for path in [*job.glob("result-markers/*.json"), *job.glob("*.json")]:
        read_json(path)  # every marker and public file present is whole JSON


def test_a_full_disk_is_a_clear_error_with_no_half_written_file(small_disk: Path, stub_image: str) -> None:
    job = make_job_root(small_disk, "fake-codex-mode: flood\nfake-codex-flood-mb: 8\n")
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert done.returncode == 3, done.stderr
    assert "cannot be written" in done.stderr and "No space left on device" in done.stderr
    _no_half_written_files(job)


@pytest.fixture
def three_mb_tree_image(docker_client, stub_image: str):
    """The stub with a 3 MB file more in its buggy tree: a tree that fits a small disk its baseline then fills."""
    import io
    import os

    tag = f"agentissue-runner-3mb:{os.getpid()}"
    dockerfile = (f"FROM {stub_image}\n"
                  "RUN head -c 3000000 /dev/urandom > /app/source_code_buggy/assets/blob.bin\n")
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, forcerm=True)
    yield tag
    docker_client.images.remove(tag, force=True)


@pytest.mark.parametrize("cache", ["on-the-jobs-disk", "in-the-state-dir"])
def test_a_disk_that_fills_during_extract_resumes_once_space_is_freed(
    tmp_path: Path, three_mb_tree_image: str, cache: str
) -> None:
    """The tree (3 MB) fits, its baseline does not: the disk fills mid-extract. After the ballast
    goes, the rerun recognises the half-made baseline and tree, makes them again and resolves."""
    env = {"RUNNER_STATE_DIR": str(tmp_path / "state"), "RUNNER_CACHE_MAX_GB": "1"}
    with mounted_tmpfs(tmp_path / "disk", "8m") as disk:
        if cache == "on-the-jobs-disk":  # --cache-dir beside the job roots: the one disk fills for both
            env["RUNNER_CACHE_DIR"] = str(disk / "cache")
        ballast = disk / "ballast"
        ballast.write_bytes(b"\0" * 3_000_000)
        job = make_job_root(disk)
        done = run_cli("--execute", *stub_args(job, three_mb_tree_image), env=env)
        assert done.returncode == 3, done.stderr[-3000:]
        assert "cannot be written" in done.stderr and "No space left on device" in done.stderr
        _no_half_written_files(job)
        assert not (job / "buggy-source").exists()  # a failed extract leaves no tree a rerun would refuse

        ballast.unlink()
        done = run_cli("--execute", *stub_args(job, three_mb_tree_image), env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        if cache == "on-the-jobs-disk":  # tree and baseline fit again, a third copy for the cache does not
            (failed,) = log_events(done.stderr, "cache_fill_failed")
            assert failed["level"] == "warning" and failed["reason"] == "OSError: ENOSPC"
        else:
            assert len(log_events(done.stderr, "cache_entry_stored")) == 1
        run = read_json(job / "benchmark_run.compact.json")
        assert run["official_task_score"]["resolved"] is True and run["first_failed_phase"] is None
        assert _marker(job, "extract")["details"]["file_count"] == 6  # the stub's five and the blob
        assert (job / "buggy-source" / "assets" / "blob.bin").stat().st_size == 3_000_000
        leftovers = [p.name for p in job.rglob("*") if p.name.startswith(("tmp_obj_", "tmp_pack_", ".buggy-source.partial"))]
        assert leftovers == []


def test_a_read_only_job_root_is_a_clear_error(small_disk: Path, stub_image: str) -> None:
    job = make_job_root(small_disk)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert done.returncode == 3, done.stderr
    assert "cannot be written" in done.stderr and "Read-only file system" in done.stderr
    assert sorted(p.name for p in job.rglob("*")) == ["context", "prompt.md"]
