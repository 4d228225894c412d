"""Who owns a container: enough to tell, later, whether that runner process is still alive.

A pid alone is not enough: pids are reused after a reboot, and a pid seen from
another pid namespace (another sandbox on the same daemon) means nothing here.
So a container records the boot id, the pid namespace, the pid and the
process's start time; a sweep judges only containers from this boot and this
namespace, and calls one dead when its pid is gone or now names another process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache


_ZOMBIE = "zombie"


def stat_fields(pid: int | str) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name (field 3, the state, first); None once gone.

    The name is cut at the last ')': a process may name itself anything, spaces and ')' too.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks; ``_ZOMBIE`` for a zombie; None when unreadable."""
    fields = stat_fields(pid)
    if not fields:
        return None
    if fields[0] == "Z":
        return _ZOMBIE
    return fields[19] if len(fields) > 19 else None  # field 22 of stat: starttime


@dataclass(frozen=True)
class Owner:
    boot_id: str
    pid_namespace: str
    pid: int
    start_ticks: str

    def same_place(self, other: Owner) -> bool:
        return (self.boot_id, self.pid_namespace) == (other.boot_id, other.pid_namespace)

    def alive(self) -> bool:
        """Judged from a process in the same place: is that very process still running?

        When /proc hides other users' processes (``hidepid``), a live pid we may not
        inspect counts as alive: a sweep must never take a live run for a dead one.
        """
        ticks = _start_ticks(self.pid)
        if ticks is not None:
            return ticks == self.start_ticks
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True  # it exists (or may not be signalled): unverifiable, so alive


@lru_cache(maxsize=1)
def current_owner() -> Owner:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as boot:
            boot_id = boot.read().strip()
    except OSError:
        boot_id = "unknown"
    try:
        pid_namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        pid_namespace = "unknown"
    pid = os.getpid()
    return Owner(boot_id=boot_id, pid_namespace=pid_namespace, pid=pid, start_ticks=_start_ticks(pid) or "unknown")


# A forked process (a task of a fork server, a server forked from its supervisor) is another owner.
os.register_at_fork(after_in_child=current_owner.cache_clear)
