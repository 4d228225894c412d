"""The warm start: tasks forked by a preloaded server, for real (stub image, fake codex, real Docker, real signals)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from reducers.models import PHASE_ORDER, Phase, TerminalState
from runner.errors import ExitCode
from runner.faults import CRASH_ENV
from runner.tasks.protocol import TaskRequest
from runner.tasks.spec import read_operator
from runner.tasks.supervisor import TaskEnd, TaskProcesses, TaskStarter, run_task
from tests.conftest import FAKE_CODEX, REPO, make_job_root, read_json

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaked_containers")]


@pytest.fixture(params=[True, False], ids=["server forked from the supervisor", "server a fresh interpreter"])
def fork_here(request: pytest.FixtureRequest) -> bool:
    """Both ways a server starts: forked from a supervisor with no other thread (a batch), or a
    fresh ``python -m runner fork-server`` (a supervisor that has threads: a fleet worker)."""
    return request.param


def _server_cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _task(job: Path, image: str) -> TaskRequest:
    operator = read_operator({"tag": "stub_calc", "codex_bin": str(FAKE_CODEX), "codex_timeout": 120, "image": image})
    return TaskRequest(spec=operator.spec, job_root=job, host=operator.host)


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...


def _server_pid(starter: TaskStarter) -> int:
    server = starter._server
    assert server is not None, "the starter has no fork server"
    return server._process.pid


def _in_thread(request: TaskRequest, log: Path, processes: TaskProcesses, starter: TaskStarter,
               phases: list[str]) -> tuple[threading.Thread, dict[str, TaskEnd]]:
    ended: dict[str, TaskEnd] = {}
    thread = threading.Thread(target=lambda: ended.update(end=run_task(request, log, processes, phases.append, starter)))
    thread.start()
    return thread, ended


def _wait_for(path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert path.exists(), f"{path.name} never appeared"


def test_forked_tasks_run_the_whole_pipeline_each_in_a_process_and_session_of_their_own(
    tmp_path: Path, stub_image: str, fork_here: bool,
) -> None:
    with TaskStarter(warm=True, fork_here=fork_here) as starter:
        server = _server_pid(starter)
        assert ("fork-server" in _server_cmdline(server)) is not fork_here
        for round_ in ("first", "second"):  # the second: the same server, a fresh child
            job = make_job_root(tmp_path / round_, "Fix calc.add.\nfake-codex-mode: hang\n")
            processes, phases = TaskProcesses(), []
            thread, ended = _in_thread(_task(job, stub_image), tmp_path / f"{round_}.log", processes, starter, phases)
            _wait_for(job / "buggy-source" / "hang.pid")
            (child,) = list(processes._running)
            state = _stat(child.pid)
            assert int(state[1]) == server  # forked by the server, not started by this process
            assert int(state[3]) == child.pid  # its own session
            assert child.pid != server and child.poll() is None
            processes.stop_all()
            thread.join(120)
            end = ended["end"]
            assert end.returncode == ExitCode.INTERRUPTED and end.outcome.exit_code == ExitCode.INTERRUPTED
            assert read_json(job / "result-markers" / "codex.json")["reason"] == "interrupted"
            assert phases[-1] == "codex"
        job = make_job_root(tmp_path / "resolved")
        phases = []
        end = run_task(_task(job, stub_image), tmp_path / "resolved.log", TaskProcesses(), phases.append, starter)
        assert _server_pid(starter) == server
    assert end.returncode == 0 and end.outcome.reduced.terminal_state is TerminalState.RESOLVED
    assert phases == [phase.value for phase in PHASE_ORDER if phase is not Phase.REDUCE]
    assert end.outcome.run.model_dump(mode="json") == read_json(job / "benchmark_run.compact.json")
    log_text = (tmp_path / "resolved.log").read_text()
    assert log_text.startswith('{"event": "task_process_started"') and '"phase_finished"' in log_text
    assert not Path(f"/proc/{server}").exists() or _stat(server)[0] == "Z"  # closed with its starter


def test_a_forked_task_runs_with_the_supervisors_environment_of_the_moment(
    tmp_path: Path, stub_image: str, monkeypatch: pytest.MonkeyPatch, fork_here: bool,
) -> None:
    with TaskStarter(warm=True, fork_here=fork_here) as starter:
        first = make_job_root(tmp_path / "first")
        assert run_task(_task(first, stub_image), tmp_path / "first.log", TaskProcesses(), starter=starter).returncode == 0
        monkeypatch.setenv(CRASH_ENV, "extract-placed")  # set after the server started: only a task sent it sees it
        crashed = run_task(_task(make_job_root(tmp_path / "crash"), stub_image), tmp_path / "crash.log",
                           TaskProcesses(), starter=starter)
        monkeypatch.delenv(CRASH_ENV)
        after = run_task(_task(make_job_root(tmp_path / "after"), stub_image), tmp_path / "after.log",
                         TaskProcesses(), starter=starter)
    assert crashed.returncode == -signal.SIGKILL and crashed.outcome is None
    assert after.returncode == 0 and after.outcome.reduced.terminal_state is TerminalState.RESOLVED


def test_a_sigterm_the_instant_a_forked_task_starts_takes_the_interrupt_path(
    tmp_path: Path, stub_image: str, fork_here: bool,
) -> None:
    processes = TaskProcesses()
    processes.stopping.set()  # add() signals each child the moment it is registered
    with TaskStarter(warm=True, fork_here=fork_here) as starter:
        ends = [run_task(_task(make_job_root(tmp_path / str(i)), stub_image), tmp_path / f"{i}.log", processes,
                         starter=starter) for i in range(5)]
    for end in ends:  # never killed by the default disposition (-15) before its handlers were in
        assert end.returncode == ExitCode.INTERRUPTED, end
        assert end.outcome is not None and end.outcome.exit_code == ExitCode.INTERRUPTED


def test_a_server_that_dies_takes_its_tasks_through_the_interrupt_path_and_the_next_starts_cold(
    tmp_path: Path, stub_image: str, fork_here: bool,
) -> None:
    with TaskStarter(warm=True, fork_here=fork_here) as starter:
        server = _server_pid(starter)
        job = make_job_root(tmp_path / "hung", "Fix calc.add.\nfake-codex-mode: hang\n")
        processes, phases = TaskProcesses(), []
        thread, ended = _in_thread(_task(job, stub_image), tmp_path / "hung.log", processes, starter, phases)
        _wait_for(job / "buggy-source" / "hang.pid")
        os.kill(server, signal.SIGKILL)
        thread.join(120)
        assert not thread.is_alive()
        end = ended["end"]
        assert end.outcome is not None and end.outcome.exit_code == ExitCode.INTERRUPTED
        assert read_json(job / "result-markers" / "codex.json")["reason"] == "interrupted"
        assert end.returncode == -signal.SIGTERM  # no server to report its status: its end, as SIGTERM's

        cold_job = make_job_root(tmp_path / "cold")
        processes = TaskProcesses()
        thread, ended = _in_thread(_task(cold_job, stub_image), tmp_path / "cold.log", processes, starter, [])
        while not processes._running and thread.is_alive():
            time.sleep(0.01)
        started = list(processes._running)
        thread.join(120)
        assert isinstance(started[0], subprocess.Popen)  # the task that found the server gone: a fresh interpreter
        assert ended["end"].returncode == 0
        replacement = _server_pid(starter)  # and a new server for the tasks after it
        assert replacement != server
        assert "fork-server" in _server_cmdline(replacement)  # this process has threads now: never forked
        warm_job = make_job_root(tmp_path / "warm")
        assert run_task(_task(warm_job, stub_image), tmp_path / "warm.log", TaskProcesses(), starter=starter).returncode == 0


def test_a_supervisor_killed_with_minus_9_stops_its_forked_task(tmp_path: Path, stub_image: str,
                                                               fork_here: bool) -> None:
    """The lifeline: supervisor dies -> its server dies -> the task gets SIGTERM and cleans up."""
    job = make_job_root(tmp_path, "Fix calc.add.\nfake-codex-mode: hang\n")
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from runner.tasks.protocol import TaskRequest\n"
        "from runner.tasks.supervisor import TaskProcesses, TaskStarter, run_task\n"
        "request = TaskRequest.model_validate_json(sys.stdin.read())\n"
        f"with TaskStarter(warm=True, fork_here={fork_here}) as starter:\n"
        "    run_task(request, Path(sys.argv[1]), TaskProcesses(), starter=starter)\n"
    )
    supervisor = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "task.log")], cwd=REPO,
                                  stdin=subprocess.PIPE)
    assert supervisor.stdin is not None
    supervisor.stdin.write(_task(job, stub_image).model_dump_json().encode())
    supervisor.stdin.close()
    _wait_for(job / "buggy-source" / "hang.pid")
    supervisor.kill()
    supervisor.wait()
    marker = job / "result-markers" / "codex.json"
    _wait_for(marker, 60)
    deadline = time.monotonic() + 60
    while read_json(marker).get("reason") != "interrupted" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert read_json(marker)["reason"] == "interrupted"
    _wait_for(job / "benchmark_run.compact.json", 60)  # the interrupt path's public files


def test_the_server_refuses_to_run_by_hand() -> None:
    done = subprocess.run([sys.executable, "-m", "runner", "fork-server"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0 and "started by a supervisor only" in done.stderr


def test_a_server_forked_from_its_supervisor_holds_none_of_its_descriptors(tmp_path: Path) -> None:
    """A batch forks its server while it holds its ledger's lock: the server (and every task it
    forks, for minutes) must not hold that lock, nor any other file or connection of the batch's."""
    import fcntl

    lock_path = tmp_path / "batch.lock"
    held = os.open(lock_path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    kept_open = (tmp_path / "kept.log").open("w")  # any other file of the batch's
    try:
        with TaskStarter(warm=True, fork_here=True) as starter:
            server = _server_pid(starter)
            assert "fork-server" not in _server_cmdline(server)  # forked: this process's imports, no new interpreter
            assert starter._server is not None and starter._server._ready.wait(60)  # its descriptors closed by now
            targets = [os.readlink(f"/proc/{server}/fd/{fd}") for fd in os.listdir(f"/proc/{server}/fd")]
            assert not [t for t in targets if str(tmp_path) in t], targets
            os.close(held)  # the batch lets its lock go: nobody else holds it, though the server lives on
            other = subprocess.run([sys.executable, "-c", (
                "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
                "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)"), str(lock_path)], capture_output=True)
            assert other.returncode == 0, other.stderr
            assert Path(f"/proc/{server}").exists() and _stat(server)[0] != "Z"
    finally:
        kept_open.close()
