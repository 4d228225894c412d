"""The official evaluation's string verdict, as AgentIssue-Bench's eval_patches.py computes it.

Pure interpretation of output the code under test wrote, so it is recorded
beside the exit-code verdict and never decides it. Rule: ``FAILED`` anywhere
fails; otherwise any success string passes. Logs are read line by line, so a
huge log costs one line of memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

# eval_patches.py (later version): the strings that count as a pass.
SUCCESS_STRINGS = (
    "PATCH SUCCEEDED",
    "PATCH SUCCESSFULLY VERIFIED",
    "FIX SUCCESSFULLY VERIFIED",
    "NO BUG",
    "FIX CONFIRMED",
    "PATCH VERIFIED",
)
FAILURE_STRING = "FAILED"
# A line longer than this is scanned in pieces that overlap by the longest needle.
_PIECE = 1 << 20


def _pieces(path: Path) -> Iterable[bytes]:
    overlap = max(len(s) for s in (*SUCCESS_STRINGS, FAILURE_STRING))
    tail = b""
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(_PIECE), b""):
            yield tail + block
            tail = block[-overlap:]


def string_verdict(logs: Iterable[Path]) -> bool:
    success = False
    for path in logs:
        if not path.exists():
            continue
        for piece in _pieces(path):
            if FAILURE_STRING.encode() in piece:
                return False
            success = success or any(s.encode() in piece for s in SUCCESS_STRINGS)
    return success
