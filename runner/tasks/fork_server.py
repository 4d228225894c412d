"""A warm start for task processes: one preloaded process per supervisor forks each task.

A task process started cold pays the interpreter's start and the runner's imports (docker,
git, pydantic, the pipeline: about half a second of CPU) before its first phase. The batch
and the fleet worker start one fork server instead (``python -m runner fork-server``, its
own child), which imports all that once and then forks a task per request. A fork takes
a few milliseconds, so the slots share one server rather than keeping one each. A
supervisor that has no other thread yet (a batch, before its slots start) forks the
server from itself instead of starting an interpreter: the server then has the
supervisor's imports already, and the first task starts at once rather than after them.

The forked task is the same task process as a cold one, run by the same ``main``:
- its own process and session (``setsid``), its stdin the request pipe, stdout
  /dev/null and stderr the task's log file, its environment the supervisor's, sent with
  the request (never the server's own);
- it ends with its server (``PR_SET_PDEATHSIG``, set by the server's one thread), and the
  server ends with its supervisor: it reads the end of its control socket when the
  supervisor's process is gone (not a death signal, which follows the thread that started it:
  a replacement server started by a slot's thread would end with that thread). So a
  supervisor killed with -9 still stops its tasks by SIGTERM;
- the server reaps it and reports its exit status, which the supervisor's handle
  (``ForkedTask``) gives as ``subprocess.Popen`` would (negative: the signal that killed it).

Invariants: the server is single-threaded and starts nothing before it forks (no thread,
no Docker client; a server forked from its supervisor closes every descriptor it inherited
but its control socket and standard streams, and freezes the objects it inherited so that
no collection finalizes one), so a child inherits nothing it would share; SIGTERM and
SIGINT are blocked across the fork and until the child's own handlers are in, so a signal
sent to a task at once is kept, never lost or fatal. Without Linux's fork and prctl, or when
the server cannot start, tasks start cold as before.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

import structlog

from runner.containment.parent_death import BATCH_PARENT_ENV
from runner.tasks.protocol import task_environment

log = structlog.get_logger(__name__)

# Set to "0" to start every task cold (a fresh interpreter each): for a comparison, or a host
# where forking a preloaded interpreter misbehaves.
FORK_SERVER_ENV = "RUNNER_FORK_SERVER"
_MAX_MESSAGE = 1024 * 1024  # one request: the task's environment (the request itself goes by pipe)
_BLOCKED = {signal.SIGTERM, signal.SIGINT}
_START_TIMEOUT = 60.0  # the server's imports, on a loaded host


def wanted(environ: dict[str, str] | os._Environ = os.environ) -> bool:
    return environ.get(FORK_SERVER_ENV, "1") != "0" and hasattr(os, "fork") and sys.platform.startswith("linux")


# -- the server: ``python -m runner fork-server --control-fd=N`` -----------------------------------


def _preload() -> None:
    """What every task imports, once, before any fork (a lazy import in a phase counts too), and
    the marker models every task builds."""
    import runner.patch_sets  # noqa: F401
    import runner.score_patches  # noqa: F401
    import runner.tasks.process  # noqa: F401  (the pipeline, its phases, docker, git, pydantic)
    from reducers.models import RESULTS, marker_type

    for phase in RESULTS:
        marker_type(phase)


def _child(control: socket.socket, wakeup: tuple[int, int], fds: list[int], environment: dict[str, str]) -> None:
    """In the forked child: become a task process, then run the very ``main`` a cold one runs."""
    code = 1
    try:
        control.close()
        for fd in wakeup:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        request, log_file, message = fds
        devnull = os.open(os.devnull, os.O_RDWR)
        for source, target in ((request, 0), (devnull, 1), (log_file, 2)):
            os.dup2(source, target)
        for fd in (request, devnull, log_file):
            os.close(fd)
        os.environ.clear()
        os.environ.update(environment)
        from runner.containment import signals
        from runner.tasks import process

        signals.install()  # the handlers in, then the blocked signals delivered to them
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED)
        sys.argv = [sys.argv[0], "task", f"--message-fd={message}"]
        code = process.main(sys.argv[1:])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - a task process never returns into the server's loop
        import traceback

        traceback.print_exc()
    finally:
        # What an interpreter's exit would do, then no return into the server's loop: the task's
        # non-daemon threads joined (as multiprocessing's children do), its streams flushed.
        try:
            threading._shutdown()  # type: ignore[attr-defined]
        except BaseException:  # noqa: BLE001
            pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _send(control: socket.socket, message: dict[str, Any]) -> None:
    control.send(json.dumps(message).encode())


def serve(argv: list[str]) -> int:
    """The server's loop: fork a task per request, report each pid and, once reaped, its status."""
    from runner.containment import signals

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # its supervisor's death ends it (then its tasks)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED)  # blocked across a fork from the supervisor
    if signals.pending() is not None:  # a SIGTERM before the line above: nothing to keep, end now
        return 128 + signal.SIGTERM
    flag = next((arg for arg in argv if arg.startswith("--control-fd=")), "")
    fd = int(flag.removeprefix("--control-fd=") or "-1")
    if fd < 3:
        raise SystemExit("runner fork-server: started by a supervisor only (--control-fd=N, N >= 3)")
    control = socket.socket(fileno=fd)
    _preload()
    wakeup = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    signal.set_wakeup_fd(wakeup[1])
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wakeup[0], selectors.EVENT_READ)
    _send(control, {"ready": os.getpid()})
    while True:
        for key, _events in selector.select():
            if key.fileobj is control:
                data, fds, _flags, _addr = socket.recv_fds(control, _MAX_MESSAGE, 3)
                if not data:
                    return 0  # the supervisor is done (or gone)
                environment = json.loads(data)["env"]
                signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
                try:
                    pid = os.fork()
                    if pid == 0:
                        _child(control, wakeup, fds, environment)
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED)
                for received in fds:
                    os.close(received)
                _send(control, {"started": pid})
            else:
                try:
                    while os.read(wakeup[0], 512):
                        pass
                except BlockingIOError:
                    pass
                _reap(control)


def _reap(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(control, {"ended": pid, "returncode": os.waitstatus_to_exitcode(status)})


def main(argv: list[str]) -> int:
    code = serve(argv)
    # Nothing is left to flush or finalize (stdout is /dev/null, it logs nothing): skip the
    # interpreter's teardown, which took longer than the whole last step of a batch.
    os._exit(code)


# -- the supervisor's side ---------------------------------------------------------------------------


class ForkedTask:
    """A forked task process, as the supervisor sees it: the part of ``subprocess.Popen`` it uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.stdin: BinaryIO | None = None
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _end(self, returncode: int) -> None:
        self.returncode = returncode
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"task {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:  # reaped and reported: its pid may be another process's by now
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServerGone(OSError):
    """The server died or stopped answering: the caller starts the task cold."""


class ForkServer:
    """The supervisor's handle on its fork server: ``start`` a task, ``close`` when the last has ended.

    Thread-safe: slots start tasks at once; one lock keeps each request and its reply together.
    A server that dies takes its running tasks with it (they get SIGTERM and take the interrupt
    path); the tasks after that start cold.
    """

    def __init__(self, *, fork_here: bool = True) -> None:
        """``fork_here``: fork the server from this process when it has no other thread (else, or
        when False, start a fresh interpreter)."""
        self._lock = threading.Lock()
        self._starting = threading.Lock()
        self._replies: list[ForkedTask] = []
        self._reply = threading.Condition(self._lock)
        self._tasks: dict[int, ForkedTask] = {}
        self._gone = False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._control = ours
        try:
            if fork_here and threading.active_count() == 1:
                self._process: subprocess.Popen | _ServerProcess = _fork_server_here(ours, theirs)
            else:  # a fork now could copy another thread's lock held: a fresh interpreter instead
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "runner", "fork-server", f"--control-fd={theirs.fileno()}"],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                    env=task_environment(os.environ),
                    start_new_session=True,  # a terminal's Ctrl-C is the supervisor's to pass on, not the server's
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, name="fork-server", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            while True:
                data = self._control.recv(_MAX_MESSAGE)
                if not data:
                    break
                message = json.loads(data)
                with self._lock:
                    if "ready" in message:
                        self._ready.set()
                    elif "started" in message:
                        task = ForkedTask(int(message["started"]))
                        self._tasks[task.pid] = task
                        self._replies.append(task)
                        self._reply.notify_all()
                    elif "ended" in message:
                        task = self._tasks.pop(int(message["ended"]), None)
                        if task is not None:
                            task._end(int(message["returncode"]))
        except (OSError, ValueError):
            pass
        finally:
            with self._lock:
                self._gone = True
                self._reply.notify_all()
                orphans = list(self._tasks.values())
                self._tasks.clear()
            self._ready.set()
            for orphan in orphans:  # they got SIGTERM with the server: no status reaches us any more
                threading.Thread(target=_wait_gone, args=(orphan,), name="fork-server-orphan", daemon=True).start()

    def start(self, sink: int, message_fd: int, environment: dict[str, str]) -> ForkedTask:
        """A forked task: its stdin a fresh pipe (``.stdin``), its stderr ``sink``, ``message_fd`` its channel.

        Raises:
            ForkServerGone: the server cannot start it; nothing was started.
        """
        if not self._ready.wait(_START_TIMEOUT) or self._gone:
            raise ForkServerGone("the fork server is not running")
        request_read, request_write = os.pipe2(os.O_CLOEXEC)
        try:
            with self._starting, self._lock:  # one request and its reply at a time
                if self._gone:
                    raise ForkServerGone("the fork server is not running")
                environment = {**environment, BATCH_PARENT_ENV: str(self._process.pid)}
                try:
                    socket.send_fds(self._control, [json.dumps({"env": environment}).encode()],
                                    [request_read, sink, message_fd])
                except OSError as e:
                    raise ForkServerGone(f"the fork server did not take the task ({e.strerror})") from e
                while not self._replies and not self._gone:
                    self._reply.wait()
                if not self._replies:
                    raise ForkServerGone("the fork server died before starting the task")
                task = self._replies.pop(0)
        except BaseException:
            os.close(request_write)
            raise
        finally:
            os.close(request_read)
        task.stdin = os.fdopen(request_write, "wb")
        return task

    def close(self) -> None:
        """Stop the server: it exits once it reads the end of its control socket."""
        try:
            self._control.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._reader.join(10)  # it reads the end of the socket when the server exits
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._control.close()


class _ServerProcess:
    """A server forked from the supervisor itself: the part of ``subprocess.Popen`` ``close`` uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG if deadline is not None else 0)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"fork server {self.pid}", timeout or 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _fork_server_here(ours: socket.socket, theirs: socket.socket) -> _ServerProcess:
    """The server as a fork of this (single-threaded) supervisor, with its imports already made.

    The child becomes what ``python -m runner fork-server`` would be: its own session, stdin and
    stdout /dev/null, no descriptor of the supervisor's but stderr and its control socket (not the
    batch's lock, not a Docker connection).
    """
    import gc

    gc.collect()  # what is garbage now is not copied into the server to be finalized there
    signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
    try:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                gc.freeze()  # the supervisor's objects are never collected here: none closes a descriptor
                control = theirs.fileno()
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)
                os.dup2(devnull, 1)
                os.closerange(3, control)
                os.closerange(control + 1, _max_fd())
                _fresh_standard_streams()
                os.setsid()
                code = serve([f"--control-fd={control}"])  # its own signal dispositions come first
            except BaseException:  # noqa: BLE001 - never return into the supervisor's code
                pass
            os._exit(code)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED)
    return _ServerProcess(pid)


def _fresh_standard_streams() -> None:
    """sys.stdin, stdout and stderr on descriptors 0, 1 and 2 again: the supervisor's may wrap a
    descriptor just closed (a test runner's capture file), whose number a task's channel gets next."""
    import faulthandler

    if faulthandler.is_enabled():
        faulthandler.disable()  # it, too, may hold a closed descriptor's number
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115 - the process's own streams
    sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = sys.__stderr__ = open(2, "w", closefd=False)  # noqa: SIM115


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (OSError, ValueError):
        return 65536


def _wait_gone(task: ForkedTask) -> None:
    """A task whose server died: no exit status will come; its end is its pid's end (-SIGTERM).

    Its new parent (init, or a subreaper) reaps it; until then it is a zombie, which is gone too.
    """
    stat = Path(f"/proc/{task.pid}/stat")
    while task.returncode is None:
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            state = "gone"
        if state in ("gone", "Z", "X"):
            task._end(-signal.SIGTERM)
            return
        time.sleep(0.2)
