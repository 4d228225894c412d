"""Batches on the stub image: concurrency, isolation, the ledger, resume, interrupt, summary."""

from __future__ import annotations

import json
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import FAKE_CODEX, RunningCli, log_events, read_json, run_cli, runner_containers

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]


def _jobs(tmp_path: Path, prompts: dict[str, str | None]) -> Path:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for tag, prompt in prompts.items():
        if prompt is not None:
            (jobs / tag / "context").mkdir(parents=True)
            (jobs / tag / "context" / "prompt.md").write_text(prompt)
    return jobs


def _span(job: Path) -> tuple[datetime, datetime]:
    """When a task's first phase started and its last recorded phase ended."""
    markers = [read_json(path) for path in (job / "result-markers").glob("*.json")]
    return (min(datetime.fromisoformat(m["started_at"]) for m in markers),
            max(datetime.fromisoformat(m["ended_at"]) for m in markers))


def _batch_args(jobs: Path, image: str, *extra: str) -> list[str]:
    return ["--execute", "--jobs-dir", str(jobs), "--image", image, "--codex-bin", str(FAKE_CODEX), *extra]


def test_a_batch_runs_concurrently_keeps_a_ledger_and_resumes(tmp_path: Path, stub_image: str) -> None:
    jobs = _jobs(tmp_path, {
        "t_fix": "fake-codex-mode: fix\n",
        "t_wrong": "fake-codex-mode: wrong-fix\n",
        "t_hang": "fake-codex-mode: hang\n",
        "t_noprompt": None,
    })
    tags_file = tmp_path / "tags.txt"
    tags_file.write_text("# suite\nt_fix\nt_wrong\nt_hang  # codex hangs: times out alone\nt_noprompt\n")
    done = run_cli(*_batch_args(jobs, stub_image, "--tags-file", str(tags_file), "--workers", "4", "--codex-timeout", "4"))
    assert done.returncode == 1, done.stderr  # a failed task makes the batch a runner failure
    summary = json.loads(done.stdout)
    assert summary["tags"] == 4 and summary["ran"] == 4 and summary["resolved"] == 1
    assert summary["resolved_rate"] == 0.25
    # the hanging codex is the agent's failure: scored (done), unresolved; the missing prompt is refused
    assert summary["states"] == {"done": 3, "failed": 1}
    assert summary["failures_by_label"] == {
        "unresolved_single_tag_eval_compact_result": 1, "failed_codex_codex_timeout": 1, "bad_input": 1
    }
    assert summary["phase_seconds"]["codex"] >= 4
    # The hanging task timed out on its own; the others were not stopped or changed by it.
    rows = {row["tag"]: row for row in read_json(jobs / "run-ledger.json")["rows"]}
    assert rows["t_fix"]["resolved"] is True and rows["t_fix"]["patch_sha256"]
    assert rows["t_wrong"]["resolved"] is False and rows["t_wrong"]["state"] == "done"
    assert rows["t_hang"]["first_failed_phase"] == "codex" and rows["t_hang"]["state"] == "done"
    assert rows["t_hang"]["infra_failure"] is False and rows["t_hang"]["exit_code"] == 1
    assert (rows["t_noprompt"]["state"], rows["t_noprompt"]["failure_label"]) == ("failed", "bad_input") and not (jobs / "t_noprompt").exists()
    assert read_json(jobs / "t_fix" / "real-result.public.json")["result_summary"]["resolved"] is True
    markdown = (jobs / "run-ledger.md").read_text()
    assert "| t_fix | done | yes |" in markdown and "| t_hang | done | no | codex |" in markdown
    # Concurrency: the three tasks that ran were all running at one instant (one worker would
    # have run them one after another), read from each task's own markers.
    spans = [_span(jobs / tag) for tag in ("t_fix", "t_wrong", "t_hang")]
    assert max(start for start, _ in spans) < min(end for _, end in spans), spans

    (jobs / "t_hang" / "context" / "prompt.md").write_text("fake-codex-mode: fix\n")
    (jobs / "t_noprompt" / "context").mkdir(parents=True)
    (jobs / "t_noprompt" / "context" / "prompt.md").write_text("fake-codex-mode: fix\n")
    fix_markers = {p.name: p.read_bytes() for p in (jobs / "t_fix" / "result-markers").iterdir()}
    again = run_cli(*_batch_args(jobs, stub_image, "--tags-file", str(tags_file), "--workers", "2"))
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["skipped_completed"] == 2 and summary["ran"] == 2 and summary["resolved"] == 2
    assert {p.name: p.read_bytes() for p in (jobs / "t_fix" / "result-markers").iterdir()} == fix_markers
    rows = {row["tag"]: row for row in read_json(jobs / "run-ledger.json")["rows"]}
    assert all(row["state"] == "done" and row["exit_code"] == 0 for row in rows.values())
    assert sorted(e["task"] for e in log_events(again.stderr, "task_skipped")) == ["t_fix", "t_wrong"]


def test_interrupting_a_batch_stops_every_task_cleanly(tmp_path: Path, stub_image: str, docker_client) -> None:
    jobs = _jobs(tmp_path, {f"t_{i}": "fake-codex-mode: hang\n" for i in range(3)})
    running = RunningCli(*_batch_args(jobs, stub_image, "--tag", "t_0", "--tag", "t_1", "--tag", "t_2", "--workers", "2"))
    for _ in range(2):
        running.wait_for("task_phase")
    deadline = time.monotonic() + 30
    while sum(1 for line in running.lines if '"task_phase": "codex"' in line) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    running.process.send_signal(signal.SIGTERM)
    code, stdout, stderr = running.finish()
    assert code == 130, stderr
    summary = json.loads(stdout)
    assert summary["interrupted"] is True and summary["states"] == {"cancelled": 2}
    rows = {row["tag"]: row for row in read_json(jobs / "run-ledger.json")["rows"]}
    assert set(rows) == {"t_0", "t_1"}, "no task may start after the interrupt"
    assert all(row["state"] == "cancelled" for row in rows.values())
    for tag in ("t_0", "t_1"):
        assert read_json(jobs / tag / "result-markers" / "codex.json")["reason"] == "interrupted"
    assert runner_containers(docker_client) == []


def test_on_a_terminal_progress_is_a_live_table(tmp_path: Path, stub_image: str) -> None:
    import re
    import shlex
    import shutil
    import subprocess
    import sys

    if shutil.which("script") is None:
        pytest.fail("util-linux `script` is needed to give the batch a terminal")
    jobs = _jobs(tmp_path, {"t_a": "fake-codex-mode: fix\n", "t_b": "fake-codex-mode: fix\n"})
    command = shlex.join([sys.executable, "-m", "runner", *_batch_args(jobs, stub_image, "--tag", "t_a", "--tag", "t_b",
                                                                        "--workers", "2")])
    done = subprocess.run(["script", "-qec", command, "/dev/null"], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout[-2000:]
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", done.stdout)  # without the terminal's escapes
    assert "2/2 done, 0 running, 0 failed" in screen
    assert "┃ task" in screen and "t_a" in screen and "t_b" in screen
    assert '"event": "task_started"' not in screen  # the table, not the log lines
    assert json.loads(screen[screen.index("{"):])["resolved"] == 2
