"""Every process codex started, found and killed, wherever it went.

Codex runs each of the agent's shell commands in a process group (or session)
of its own, so killing codex's group misses them: a background server or a
``sleep &`` would outlive the deadline and could go on editing the tree while
the patch is taken. The runner therefore makes itself a child subreaper
(orphans are re-parented to it, not to init) and, after codex, kills every
descendant it has until none is left.
"""

from __future__ import annotations

import ctypes
import os
import signal

from runner.containment.run_owner import stat_fields

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Linux only; returns whether it took effect."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(entry)
        if fields and len(fields) > 1:  # else gone meanwhile
            parents[int(entry)] = int(fields[1])
    return parents


def descendants(of: int) -> set[int]:
    parents = _parents()
    found: set[int] = set()
    frontier = {of}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def kill_descendants(*, rounds: int = 20) -> int:
    """SIGKILL every descendant of this process and reap them; returns how many were killed."""
    killed = 0
    me = os.getpid()
    for _ in range(rounds):
        alive = descendants(me)
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        _reap(alive)
    return killed


def _reap(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass  # not our child (a grandchild is reaped by its own parent, or by us once orphaned)
