"""The official evaluation's verdict, as AgentIssue-Bench's eval_patches.py (later version) computes it.

Rule, to the letter: a patch passes only when the command's exit code is 0,
``FAILED`` does not occur in its **stdout**, and stdout contains one of
``SUCCESS_STRINGS`` (case-sensitive). stderr is never read. The official command
is ``bash -c "<ep> apply_patch F && <ep> test_patched"``, whose stdout is apply's
stdout followed by the test's: so the logs handed in are read as one stream, in
order, a string cut between them still found. Logs are read in pieces, so a huge
log costs one piece of memory.
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
# A file is read in pieces of this size; consecutive pieces overlap by the longest needle.
_PIECE = 1 << 20
_OVERLAP = max(len(s) for s in (*SUCCESS_STRINGS, FAILURE_STRING))


def _pieces(paths: Iterable[Path]) -> Iterable[bytes]:
    """The files' bytes as one stream (missing files are empty), in overlapping pieces."""
    tail = b""
    for path in paths:
        if not path.exists():
            continue
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(_PIECE), b""):
                yield tail + block
                tail = (tail + block)[-_OVERLAP:]


def string_verdict(stdout_logs: Iterable[Path]) -> bool:
    """The string part of the rule: no ``FAILED`` and some success string, in stdout read as one stream."""
    success = False
    for piece in _pieces(stdout_logs):
        if FAILURE_STRING.encode() in piece:
            return False
        success = success or any(s.encode() in piece for s in SUCCESS_STRINGS)
    return success


def official_verdict(exit_code: int | None, stdout_logs: Iterable[Path]) -> bool:
    """The official score: exit code 0 (``None``: killed at the deadline, a FAILED) and the string rule."""
    return exit_code == 0 and string_verdict(stdout_logs)
