"""Stopping task processes: a supervisor's SIGTERM reaches a task whatever instant it lands."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

# The batch after its first signal: SIGTERM ignored (signals.raise_interrupt), so a task process it
# starts then inherits the ignored disposition until its own handlers are in, and the SIGTERM
# ``add`` sends it at once is lost (seen as a batch hung for good on an early SIGTERM). The stop
# signals again until every task is gone; the task's own cleanup ignores the repeats, even while
# its interpreter exits (a handler that does nothing would be put back to the default there,
# and the repeats killed it with -15 after it had written its outcome: seen on the fleet).
SCRIPT = r"""
import os, signal, subprocess, sys, threading, time
from runner.containment import signals
from runner.tasks.supervisor import TaskProcesses

signals.interrupt_from_now_on()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    sys.exit("no interrupt")
except KeyboardInterrupt:
    pass
os.kill(os.getpid(), signal.SIGTERM)  # a second signal: ignored, the cleanup goes on
children = TaskProcesses()
children.stopping.set()
TASK = '''
import signal, sys, time
time.sleep(0.5)  # the interpreter's start and imports: SIGTERM still ignored, as inherited
from runner.containment import signals
signals.interrupt_from_now_on()
try:
    time.sleep(30)
except KeyboardInterrupt:
    time.sleep(0.3)  # its cleanup, then it exits, while the stop keeps signalling
    print("cleaned up", flush=True)
    sys.exit(130)
'''
started = time.monotonic()
with children.task():
    child = subprocess.Popen([sys.executable, "-c", TASK], stdout=subprocess.PIPE, text=True)
    children.add(child)  # its first SIGTERM, lost
    threading.Thread(target=lambda: (child.wait(), children.discard(child))).start()
    stopper = threading.Thread(target=children.stop_until_idle, kwargs={"every": 0.05})
    stopper.start()
    child.wait(timeout=20)
print(child.stdout.read().strip(), child.returncode, round(time.monotonic() - started) < 10)
stopper.join(5)
print("idle", not stopper.is_alive())
"""


def test_a_task_started_during_a_stop_is_stopped_and_ends_with_its_own_cleanup() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["cleaned up 130 True", "idle True"], done.stdout


def test_a_forked_process_is_its_own_owner() -> None:
    """The owner (pid, start time) labels every container; a process forked after it was asked
    (a task of a fork server forked from its batch) must not label its containers as the batch's."""
    import os

    from runner.containment.run_owner import current_owner

    here = current_owner()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(write, str(current_owner().pid).encode())
        os._exit(0)
    os.close(write)
    child_says = int(os.read(read, 64))
    os.close(read)
    os.waitpid(pid, 0)
    assert here.pid == os.getpid() and child_says == pid
