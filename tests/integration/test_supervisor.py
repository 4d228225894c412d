"""The supervisor and its task process, for real: stub image, fake codex, real Docker, real signals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from reducers.models import PHASE_ORDER, Phase, TerminalState
from runner.errors import ExitCode
from runner.tasks.protocol import TaskRequest
from runner.tasks.spec import read_operator
from runner.tasks.supervisor import TaskProcesses, run_task
from tests.conftest import FAKE_CODEX, REPO, make_job_root, read_json

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]


def _task(job: Path, image: str) -> TaskRequest:
    operator = read_operator({"tag": "stub_calc", "codex_bin": str(FAKE_CODEX), "codex_timeout": 120, "image": image})
    return TaskRequest(spec=operator.spec, job_root=job, host=operator.host)


def test_a_task_reports_its_phases_and_outcome_on_its_pipe(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path)
    request = _task(job, stub_image)
    phases: list[str] = []
    end = run_task(request, tmp_path / "task.log", TaskProcesses(), phases.append)
    assert end.returncode == 0 and end.outcome is not None and end.outcome.exit_code == ExitCode.COMPLETED
    assert phases == [phase.value for phase in PHASE_ORDER if phase is not Phase.REDUCE]
    assert end.outcome.reduced.terminal_state is TerminalState.RESOLVED
    assert end.outcome.run.model_dump(mode="json") == read_json(job / "benchmark_run.compact.json")
    log_lines = (tmp_path / "task.log").read_text().splitlines()
    assert any(json.loads(line).get("event") == "phase_finished" for line in log_lines if line.startswith("{"))
    assert not any('"kind"' in line for line in log_lines)  # the messages never go to the log


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if ppid == parent:
                    found.append(int(entry.name))
                    todo.append(int(entry.name))
    return found


def _fd_targets(pid: int) -> set[str]:
    targets = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            targets.add(os.readlink(fd))
        except OSError:
            pass
    return targets


def test_cancel_takes_the_ctrl_c_path_and_no_agent_holds_the_pipe(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path, "Fix calc.add.\nfake-codex-mode: hang\n")
    request = _task(job, stub_image)
    processes = TaskProcesses()
    seen: list[str] = []
    ended: dict = {}
    runner = threading.Thread(
        target=lambda: ended.update(end=run_task(request, tmp_path / "task.log", processes, seen.append))
    )
    runner.start()
    hang = job / "buggy-source" / "hang.pid"
    deadline = time.monotonic() + 120
    while not hang.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert hang.exists() and seen[-1] == "codex"
    task_pid = next(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                    and b"runner\x00task\x00--message-fd=" in (p / "cmdline").read_bytes())
    fd = (Path(f"/proc/{task_pid}/cmdline").read_bytes().split(b"--message-fd=")[1].rstrip(b"\x00")).decode()
    channel = os.readlink(f"/proc/{task_pid}/fd/{fd}")
    assert channel.startswith("pipe:")
    below = _descendants(task_pid)  # codex and its agent (pids of their own namespace in hang.pid)
    assert len(below) >= 2
    assert all(channel not in _fd_targets(pid) for pid in below)  # codex and its agent cannot forge a message
    processes.stop_all()
    runner.join(120)
    end = ended["end"]
    assert end.returncode == ExitCode.INTERRUPTED and end.outcome.exit_code == ExitCode.INTERRUPTED
    assert read_json(job / "result-markers" / "codex.json")["reason"] == "interrupted"
    assert end.outcome.reduced.first_failed_phase is Phase.CODEX
    assert not any(Path(f"/proc/{pid}").exists() for pid in below)


def _task_process(stdin: bytes, *, channel: bool = True) -> tuple[subprocess.CompletedProcess, list[dict]]:
    read_fd, write_fd = os.pipe()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "runner", "task", *([f"--message-fd={write_fd}"] if channel else [])],
            input=stdin, capture_output=True, cwd=REPO, pass_fds=(write_fd,), timeout=60,
        )
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd, "rb") as messages:
        return done, [json.loads(line) for line in messages]


def test_a_bad_request_is_refused_with_an_outcome(tmp_path: Path) -> None:
    done, messages = _task_process(b'{"spec": {"tag": "t_1"}, "host": {}}')
    assert done.returncode == ExitCode.BAD_INPUT
    assert messages == [{"kind": "outcome", "exit_code": 2, "message": messages[0]["message"], "reduced": None,
                         "run": None, "evaluation": None}]
    assert "task request is not valid" in messages[0]["message"]
    refused, _ = _task_process(b"{}", channel=False)
    assert refused.returncode != 0 and b"started by the supervisor only" in refused.stderr
