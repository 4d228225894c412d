"""Token usage from ``codex exec --json`` output: the JSONL events' ``turn.completed.usage``.

Read line by line from the private stdout log, never whole; a line longer than
``MAX_LINE`` (a flood, not an event) is skipped. Only the counts leave here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MAX_LINE = 1 << 20
# No real turn spends a trillion tokens: a larger count is noise (or an attack), not usage.
MAX_TOKENS = 10**12


@dataclass(frozen=True)
class CodexUsage:
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    turns: int = 0


def _count(usage: dict, key: str) -> int:
    value = usage.get(key, 0)
    plausible = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS
    return value if plausible else 0


def _lines(path: Path):
    with path.open("rb") as handle:
        while True:
            line = handle.readline(MAX_LINE)
            if not line:
                return
            if not line.endswith(b"\n") and len(line) == MAX_LINE:
                while (rest := handle.readline(MAX_LINE)) and not rest.endswith(b"\n"):
                    pass  # the tail of an over-long line
                continue
            yield line


def usage_from_events(path: Path) -> CodexUsage:
    """Sum the usage of every ``turn.completed`` event; other lines are ignored."""
    totals = {"input_tokens": 0, "cached_input_tokens": 0, "output_tokens": 0}
    turns = 0
    if not path.exists():
        return CodexUsage()
    for line in _lines(path):
        if b'"turn.completed"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:  # not JSON, not UTF-8, or a number of thousands of digits
            continue
        if not isinstance(event, dict) or event.get("type") != "turn.completed":
            continue
        usage = event.get("usage")
        if isinstance(usage, dict):
            turns += 1
            for key in totals:
                totals[key] += _count(usage, key)
    return CodexUsage(turns=turns, **totals)
