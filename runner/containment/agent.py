"""Containment: the kernel, not a race, ends every process the agent started.

Invariants:
- codex runs as the first process of a PID namespace of its own
  (``unshare --pid --fork --kill-child --mount-proc``): when it ends, or is killed,
  the kernel kills every other process of that namespace and ``unshare`` returns
  only once they are all gone; no fork chain, session or double fork leaves it,
  and from inside it the runner's own pid cannot even be named;
- the wrapper dies with the runner (``PR_SET_PDEATHSIG``), and the namespace
  with the wrapper (``--kill-child``): a runner killed with SIGKILL leaves no agent;
- the runner's own children (git) die with it too (``die_with_parent_prefix``);
- with ``agent_user`` the agent runs as that unprivileged user (``setpriv``), so
  it cannot write any file of the job root that it does not own.
Where ``unshare`` cannot make a PID namespace (no privilege), the runner falls
back to its subreaper (``runner.containment.descendants``) and says so in the log.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import structlog

from runner.containment.run_owner import _ZOMBIE, _start_ticks
from runner.errors import AgentNotContainedError, BadInputError

log = structlog.get_logger(__name__)

UNSHARE = ("--pid", "--fork", "--kill-child", "--mount-proc")


@lru_cache(maxsize=1)
def die_with_parent_prefix() -> tuple[str, ...]:
    """A command prefix that makes the command SIGKILLed when the runner dies (``PR_SET_PDEATHSIG``).

    A prefix (``setpriv --pdeathsig``), not a ``preexec_fn``: with one, CPython runs its
    at-fork handlers around every fork, and a Ctrl-C landing in one of them is silently
    dropped (seen: a SIGINT during baseline lost in logging's at-fork lock release).
    """
    setpriv = shutil.which("setpriv")
    return (setpriv, "--pdeathsig=SIGKILL", "--") if setpriv else ()


@lru_cache(maxsize=1)
def pid_namespaces_available() -> bool:
    """Can this process give a child a PID namespace of its own? (Needs CAP_SYS_ADMIN.)"""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    try:
        done = subprocess.run([unshare, *UNSHARE, "true"], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@dataclass(frozen=True)
class AgentUser:
    uid: int
    gid: int


def wrap(argv: list[str], agent: AgentUser | None) -> list[str]:
    """``argv`` run inside a fresh PID namespace (when possible), as ``agent`` (when given)."""
    if agent is not None:
        setpriv = shutil.which("setpriv") or "setpriv"
        argv = [setpriv, f"--reuid={agent.uid}", f"--regid={agent.gid}", "--clear-groups",
                "--no-new-privs", "--pdeathsig=SIGKILL", "--", *argv]
    if pid_namespaces_available():
        argv = [shutil.which("unshare") or "unshare", *UNSHARE, *argv]
    return [*die_with_parent_prefix(), *argv]


def pid_namespace_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def namespace_init(wrapper_pid: int, *, timeout: float = 5.0) -> int | None:
    """The first process of the namespace ``unshare`` made: its only child."""
    deadline = time.monotonic() + timeout
    mine = pid_namespace_of(os.getpid())
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{wrapper_pid}/task/{wrapper_pid}/children", encoding="ascii") as children:
                pids = [int(p) for p in children.read().split()]
        except OSError:
            return None  # the wrapper is gone already
        for pid in pids:
            if pid_namespace_of(pid) not in (None, mine):
                return pid
        time.sleep(0.01)
    return None


def end_agent(record: dict[str, Any] | None, *, timeout: float = 30.0) -> bool:
    """SIGKILL the agent's first process, if that very process (pid and start time) still runs,
    and wait until it is gone; False if it survives. In a PID namespace of its own that ends
    every process it started: the kernel kills and reaps them all before the first one can end.
    """
    if not record or not isinstance(record.get("pid"), int):
        return True
    pid, start = record["pid"], record.get("start")
    deadline = time.monotonic() + timeout
    while True:
        ticks = _start_ticks(pid)
        if ticks is None or ticks == _ZOMBIE or ticks != start:
            return True
        if time.monotonic() > deadline:
            return False
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return True
        time.sleep(0.02)


def resolve_agent_user(name: str | None) -> AgentUser | None:
    """The user ``--agent-user`` names, or None.

    Raises:
        BadInputError: the user does not exist, is root, or the runner is not root
            (only root can start a process as another user).
    """
    if name is None:
        return None
    import pwd


    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise BadInputError(f"--agent-user {name!r} does not exist on this host; create it (useradd --system)") from None
    if entry.pw_uid == 0:
        raise BadInputError("--agent-user must be an unprivileged user, not root")
    if os.geteuid() != 0:
        raise BadInputError("--agent-user needs the runner to run as root (to start the agent as another user)")
    return AgentUser(uid=entry.pw_uid, gid=entry.pw_gid)


def hand_over(tree: Path, agent: AgentUser) -> None:
    """Give ``tree`` (and everything in it) to the agent's user; links are changed, never followed."""
    from runner.trees import walk

    os.lchown(tree, agent.uid, agent.gid)
    for relative, _entry in walk(tree):
        os.lchown(tree / relative, agent.uid, agent.gid)


class _NoJournal:
    """For callers without a job root's journal (unit tests of a phase): records nothing."""

    def agent_starting(self, run_id: str) -> None: ...
    def agent_contained(self, record: dict[str, Any]) -> None: ...


@contextmanager
def agent_process(argv: list[str], *, journal: Any, run_id: str, agent: AgentUser | None, **popen: Any) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``argv`` contained (see the module's invariants) and, when the block ends, however
    it ends, kill it with every process it started and wait until they are all gone.

    The journal records the agent before it starts and its namespace once known, so that a
    runner that dies meanwhile leaves a record the next run checks.

    Raises:
        AgentNotContainedError: processes of the agent are still alive 30 s after SIGKILL.
    """
    journal = journal or _NoJournal()
    journal.agent_starting(run_id)
    child = subprocess.Popen(wrap(argv, agent), start_new_session=True, **popen)
    if not pid_namespaces_available():
        log.warning("agent_not_in_a_pid_namespace", reason="unshare cannot make one here; the subreaper must catch its processes")
    first = namespace_init(child.pid) if pid_namespaces_available() else child.pid
    record = {"pid": first, "start": _start_ticks(first) if first else None, "namespace": first != child.pid}
    journal.agent_contained(record)
    try:
        yield child
    finally:
        if not end_agent(record):
            raise AgentNotContainedError("the agent's first process survived SIGKILL")
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        child.wait()
