"""The interrupt path's signal handling, in a process of its own (handlers are process-wide)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

# After its first signal the process ignores further ones, and a process it starts then (a batch
# starting a task while it stops) still ends on SIGTERM before it installed any handler: that
# child has nothing but the default disposition. Seen as a batch hung for good on an early SIGTERM.
SCRIPT = r"""
import os, signal, subprocess, sys, time
from runner.containment import signals

signals.interrupt_from_now_on()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    sys.exit("no interrupt")
except KeyboardInterrupt:
    pass
os.kill(os.getpid(), signal.SIGTERM)  # a second signal: ignored, the cleanup goes on
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.2)
child = subprocess.Popen(["sleep", "30"])
child.send_signal(signal.SIGTERM)
print("child", child.wait(timeout=10))
"""


def test_a_process_started_after_the_interrupt_still_ends_on_sigterm() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "child -15"
