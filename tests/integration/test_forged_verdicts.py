"""Forged verdicts: an agent that outlives or outwits the runner never decides a verdict.

Each test provokes the case with a misbehaving fake codex, which runs without any
sandbox (the worst case), and asserts the verdict, the markers, the public files,
that no process of the agent and no runner container is left (the fixture), and
that nothing outside the job roots changed.
"""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest

from tests.conftest import (
    RunningCli,
    agent_gone,
    make_job_root,
    processes_in,
    read_json,
    remove_deep_chain,
    run_cli,
    snapshot_outside,
    stub_args,
)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]


def _marker(job: Path, phase: str) -> dict:
    return read_json(job / "result-markers" / f"{phase}.json")


def test_markers_forged_before_the_runner_is_killed_are_never_trusted(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path, "fake-codex-mode: forge-and-kill\n")
    before = snapshot_outside(tmp_path, job)
    running = RunningCli("--execute", *stub_args(job, stub_image))
    running.wait_for_file(job / "buggy-source" / "forged.done")
    if running.process.poll() is None:  # the agent could not reach the runner: kill it as it meant to
        running.process.kill()
    running.finish()
    assert agent_gone(job / "buggy-source")
    assert _marker(job, "evaluate")["details"]["resolved"] is True  # the forgery is on disk
    reduced = run_cli("--reduce", "--job-root", str(job), "--tag", "stub_calc")
    assert reduced.returncode == 2 and "not what the runner recorded" in reduced.stderr, reduced.stderr
    assert not (job / "benchmark_run.compact.json").exists()  # nothing forged was published

    # The operator reruns the same command, as the README says after a crash.
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert done.returncode == 1, done.stderr
    assert '"untrusted_markers_replaced"' in done.stderr and '"unwatched_agent_found"' in done.stderr
    run = read_json(job / "benchmark_run.compact.json")
    assert run["official_task_score"]["resolved"] is False
    assert run["first_failed_phase"] == "codex"
    assert not (job / "result-markers" / "patch.json").exists()
    assert not (job / "result-markers" / "evaluate.json").exists()
    assert not (job / "Patches" / "stub_calc" / "attempt.patch").exists()
    assert agent_gone(job / "buggy-source")
    assert snapshot_outside(tmp_path, job) == before


def test_a_tree_1100_levels_deep_cannot_break_the_tamper_check(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path, "fake-codex-mode: deep-forge\n")
    before = snapshot_outside(tmp_path, job)
    try:
        for _attempt in range(2):  # and on every rerun
            done = run_cli("--execute", *stub_args(job, stub_image))
            assert done.returncode == 1, done.stderr
            assert _marker(job, "codex")["reason"] == "codex_wrote_runner_files", done.stderr
            run = read_json(job / "benchmark_run.compact.json")
            assert run["official_task_score"]["resolved"] is False
            assert not (job / "result-markers" / "evaluate.json").exists()
            assert not (job / "result-markers" / "patch.json").exists()
            remove_deep_chain(job / "buggy-source" / "d")
        assert agent_gone(job / "buggy-source")
        assert snapshot_outside(tmp_path, job) == before
    finally:
        remove_deep_chain(job / "buggy-source" / "d")  # pytest's own clean-up recurses


@pytest.fixture
def deep_source_image(docker_client, stub_image: str):
    tag = f"agentissue-runner-deep:{os.getpid()}"
    dockerfile = (
        f"FROM {stub_image}\n"
        "RUN cd /app/source_code_buggy && i=0 && while [ $i -lt 1000 ]; do mkdir d && cd d; i=$((i+1)); done "
        "&& echo deep > leaf.txt\n"
    )
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, forcerm=True)
    yield tag
    docker_client.images.remove(tag, force=True)


def test_a_source_tree_1000_levels_deep_is_extracted_fixed_and_resolved(
    tmp_path: Path, deep_source_image: str
) -> None:
    job = make_job_root(tmp_path)
    try:
        done = run_cli("--execute", *stub_args(job, deep_source_image))
        assert done.returncode == 0, done.stderr
        assert _marker(job, "extract")["details"]["directory_count"] >= 1000
        assert read_json(job / "benchmark_run.compact.json")["official_task_score"]["resolved"] is True
    finally:
        remove_deep_chain(job / "buggy-source" / "d")  # pytest's own clean-up recurses


def test_fork_chains_in_sessions_of_their_own_all_end_with_codex(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path, "fake-codex-mode: fork-chains\nfake-codex-chain-seconds: 15\n")
    before = snapshot_outside(tmp_path, job)
    started = time.monotonic()
    done = run_cli("--execute", *stub_args(job, stub_image))
    assert done.returncode == 0, done.stderr
    assert (job / "buggy-source" / "chains.started").exists()
    assert processes_in(job / "buggy-source") == []  # at the runner's exit, not one chain is left
    published = (job / "benchmark_run.compact.json").read_bytes()
    time.sleep(max(0.0, 17 - (time.monotonic() - started)))  # past the survivors' moment to write
    assert (job / "benchmark_run.compact.json").read_bytes() == published
    assert read_json(job / "benchmark_run.compact.json")["official_task_score"]["resolved"] is True
    assert snapshot_outside(tmp_path, job) == before


def test_one_task_cannot_forge_a_siblings_verdict_in_a_batch(tmp_path: Path, stub_image: str) -> None:
    jobs = tmp_path / "jobs"
    for tag, mode in (("a_forger", "forge-sibling"), ("b_victim", "no-change")):
        (jobs / tag / "context").mkdir(parents=True)
        (jobs / tag / "context" / "prompt.md").write_text(f"fake-codex-mode: {mode}\n")
    from tests.conftest import FAKE_CODEX

    done = run_cli("--execute", "--jobs-dir", str(jobs), "--tag", "a_forger", "--tag", "b_victim",
                   "--image", stub_image, "--codex-bin", str(FAKE_CODEX), "--workers", "1")
    assert done.returncode == 1, done.stderr  # the victim fails honestly: its agent changed nothing
    victim = jobs / "b_victim"
    run = read_json(victim / "benchmark_run.compact.json")
    assert run["official_task_score"]["resolved"] is False
    assert run["failure_attribution_labels"] == ["failed_patch_empty_patch"]
    assert _marker(victim, "codex")["started_at"] != "2026-01-01T00:00:00.000+00:00"
    ledger = read_json(jobs / "run-ledger.json")
    rows = {row["tag"]: row for row in ledger["rows"]}
    assert rows["b_victim"]["resolved"] is False
    assert rows["a_forger"]["resolved"] is True

    # A ledger row forged as completed and resolved does not make a rerun of the batch skip the tag.
    import json

    rows["b_victim"].update(state="done", resolved=True, exit_code=0)
    (jobs / "run-ledger.json").write_text(json.dumps(ledger))
    done = run_cli("--execute", "--jobs-dir", str(jobs), "--tag", "b_victim",
                   "--image", stub_image, "--codex-bin", str(FAKE_CODEX))
    assert done.returncode == 1, done.stderr
    rows = {row["tag"]: row for row in read_json(jobs / "run-ledger.json")["rows"]}
    assert rows["b_victim"]["resolved"] is False


def test_an_agent_run_as_another_user_cannot_write_the_job_root(open_tmp: Path, stub_image: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("--agent-user needs the runner to run as root")
    job = make_job_root(open_tmp, "fake-codex-mode: try-forge\n")
    job.chmod(0o711)
    before = snapshot_outside(open_tmp, job)
    done = run_cli("--execute", *stub_args(job, stub_image, "--agent-user", "nobody"))
    assert done.returncode == 0, done.stderr  # nothing of the runner's was touched: the attempt stands
    assert "untrusted_markers_replaced" not in done.stderr
    assert _marker(job, "prepare")["status"] == "ok" and "forged" not in (job / "context" / "prompt.md").read_text()
    assert not (job / "newfile.txt").exists()
    assert read_json(job / "benchmark_run.compact.json")["official_task_score"]["resolved"] is True
    assert (job / "buggy-source" / "calc" / "_impl.py").stat().st_uid != 0  # the agent's own file
    assert agent_gone(job / "buggy-source")
    assert snapshot_outside(open_tmp, job) == before
