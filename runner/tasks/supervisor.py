"""The supervisor: every task runs in a process of its own, started and watched from here.

The batch, ``--attempts`` and the fleet worker are thin users of ``run_task``. A task
process (``python -m runner task``, ``runner.tasks.process``) reads its ``TaskRequest``
as JSON on stdin and reports each phase it starts and its final outcome as JSON lines
on a pipe of its own (never its log, never stdout, which a grandchild could share).

Invariants:
- the task process owns every process below it (the reaper's rule): one task each;
- its stderr is the log file itself, not a pipe through the supervisor: each line lands
  as it is written, and the supervisor dying (even by -9) cannot break it; the task
  ends with its supervisor (``runner/containment/parent_death.py``);
- cancelling is SIGTERM, which the task turns into the very path Ctrl-C takes
  (containers removed, marker ``interrupted``, public files written).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from signal import SIGTERM
from typing import Protocol

import structlog
from pydantic import ValidationError

from runner.containment.parent_death import BATCH_PARENT_ENV
from runner.lock import LOCK_NAME
from runner.tasks import fork_server
from runner.tasks.protocol import PhaseStarted, TaskEvent, TaskOutcome, TaskRequest, task_environment

log = structlog.get_logger(__name__)

# A task of an earlier batch that died may still be cleaning up (it got SIGTERM with its batch):
# its job root's lock is waited for this long before the task is started anyway (and refused).
STALE_LOCK_WAIT = 60.0


@dataclass(frozen=True)
class TaskEnd:
    returncode: int  # the process's own, as subprocess says it: negative when a signal killed it
    outcome: TaskOutcome | None  # None: it died before saying how it ended


class ChildRegistry(Protocol):
    """Where a task process is registered while it runs, so a stop can reach it."""

    def add(self, child: subprocess.Popen) -> None: ...
    def discard(self, child: subprocess.Popen) -> None: ...


class TaskProcesses:
    """The running task processes, so one stop (Ctrl-C, a drain) can cancel every one of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self._tasks = 0  # tasks between their first step and their end, started process or not
        self.stopping = threading.Event()

    @contextmanager
    def task(self) -> Iterator[None]:
        """Around a task, from before it looks at ``stopping`` to after its process ended."""
        with self._lock:
            self._tasks += 1
        try:
            yield
        finally:
            with self._lock:
                self._tasks -= 1

    def idle(self) -> bool:
        with self._lock:
            return self._tasks == 0

    def add(self, child: subprocess.Popen) -> None:
        with self._lock:
            self._running.add(child)
            if self.stopping.is_set():
                child.send_signal(SIGTERM)

    def discard(self, child: subprocess.Popen) -> None:
        with self._lock:
            self._running.discard(child)

    def stop_all(self) -> None:
        with self._lock:
            self.stopping.set()
            for child in self._running:
                if child.poll() is None:
                    child.send_signal(SIGTERM)

    def stop_until_idle(self, every: float = 0.5) -> None:
        """SIGTERM to every running task, again each ``every`` seconds, until no task is left.

        Once is not enough: a task started while its supervisor stops inherits the supervisor's
        ignored SIGTERM (``signals.raise_interrupt``) until its own handlers are in, so the first
        signal can be lost; a task already cleaning up ignores the repeats. A task that begins
        after this returned sees ``stopping`` and starts nothing.
        """
        while True:
            self.stop_all()
            if self.idle():
                return
            time.sleep(every)


def _wait_for_stale_lock(job_root: Path, timeout: float = STALE_LOCK_WAIT) -> None:
    """Wait (bounded) while another process holds the job root's lock: after a batch died with -9,
    its tasks are still ending (they got SIGTERM with it) when the rerun starts them again."""
    path = job_root / LOCK_NAME
    if not path.exists():
        return
    deadline = time.monotonic() + timeout
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return  # free (released when fd closes)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN) or time.monotonic() > deadline:
                    return  # the task itself will refuse, naming the holder
            time.sleep(0.2)
    finally:
        os.close(fd)


class TaskStarter:
    """How a supervisor starts its task processes: forked by its fork server (warm), or cold.

    One per supervisor (a batch, a worker), shared by its slots, closed when its last task has
    ended. A server that dies is replaced for the next task; the task that found it gone starts
    cold (``runner.tasks.fork_server``).
    """

    def __init__(self, warm: bool | None = None, *, fork_here: bool = True) -> None:
        self.warm = fork_server.wanted() if warm is None else warm
        self._fork_here = fork_here  # how its server starts (runner.tasks.fork_server.ForkServer)
        self._lock = threading.Lock()
        self._server: fork_server.ForkServer | None = None
        self._closed = False

    def __enter__(self) -> TaskStarter:
        if self.warm:
            self._server_now()  # its imports run while the supervisor does its own first steps
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _server_now(self) -> fork_server.ForkServer | None:
        with self._lock:
            if self._server is None and self.warm and not self._closed:
                try:
                    self._server = fork_server.ForkServer(fork_here=self._fork_here)
                except OSError as e:
                    log.warning("fork_server_not_started", error_type=type(e).__name__)
            return self._server

    def start(self, sink: int, message_fd: int, environment: dict[str, str]) -> subprocess.Popen | fork_server.ForkedTask:
        server = self._server_now()
        if server is not None:
            try:
                return server.start(sink, message_fd, environment)
            except fork_server.ForkServerGone as e:
                log.warning("fork_server_gone", reason=str(e))
                with self._lock:
                    if self._server is server:
                        self._server = None
                server.close()
                self._server_now()  # the next one's imports run beside this task
        return cold_start(sink, message_fd, environment)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            server, self._server = self._server, None
        if server is not None:
            server.close()


def cold_start(sink: int, message_fd: int, environment: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "runner", "task", f"--message-fd={message_fd}"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=sink, pass_fds=(message_fd,),
        env=environment, start_new_session=True,  # a terminal's Ctrl-C reaches the supervisor only; it passes one SIGTERM on
    )


def _start(log_path: Path, message_fd: int, starter: TaskStarter | None) -> subprocess.Popen | fork_server.ForkedTask:
    # Appended, never truncated: a task run again (a resume, a resubmission, a retry) keeps the
    # earlier runs' lines, each run after a separator line of its own.
    with log_path.open("ab") as sink:
        separator = {"event": "task_process_started", "level": "info",
                     "timestamp": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")}
        sink.write(json.dumps(separator).encode() + b"\n")
        sink.flush()
        # Named, the supervisor's pid lets the task end with it (runner/containment/parent_death.py);
        # a forked task names its server instead, which ends with the supervisor.
        environment = {**task_environment(os.environ), BATCH_PARENT_ENV: str(os.getpid())}
        if starter is None:
            return cold_start(sink.fileno(), message_fd, environment)
        return starter.start(sink.fileno(), message_fd, environment)


def _hand_over(child: subprocess.Popen, request: TaskRequest) -> None:
    try:
        child.stdin.write(request.model_dump_json().encode())
        child.stdin.close()
    except OSError:
        pass  # it died at once: its exit code says how


def run_task(
    request: TaskRequest,
    log_path: Path,
    children: ChildRegistry,
    on_phase: Callable[[str], None] = lambda _phase: None,
    starter: TaskStarter | None = None,
) -> TaskEnd:
    """Run one task in a process of its own until it ends; ``on_phase`` hears each phase it starts.

    ``starter``: the supervisor's (warm, forked); without one the task starts cold.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    _wait_for_stale_lock(request.job_root)
    read_fd, write_fd = os.pipe()
    try:
        child = _start(log_path, write_fd, starter)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)  # the task holds the only write end: its exit is the channel's end
    children.add(child)
    try:
        _hand_over(child, request)
        outcome: TaskOutcome | None = None
        with os.fdopen(read_fd, "rb") as channel:
            for line in channel:
                try:
                    event = TaskEvent.validate_json(line)
                except ValidationError:
                    log.warning("task_message_unreadable", bytes=len(line))
                    continue
                if isinstance(event, PhaseStarted):
                    on_phase(event.phase.value)
                else:
                    outcome = event
        return TaskEnd(returncode=child.wait(), outcome=outcome)
    finally:
        children.discard(child)
        if child.poll() is None:
            child.kill()
            child.wait()
