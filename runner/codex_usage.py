"""Token usage and the failure class from ``codex exec --json`` output (JSONL events).

Read line by line from the private stdout log, never whole; a line longer than
``MAX_LINE`` (a flood, not an event) is skipped. Only counts and a short error
class leave here, never an event's text.

Usage is summed over every turn event that carries it, failed turns included
(codex-cli 0.171.0 puts ``usage`` on ``turn.completed`` only; a ``usage`` on
``turn.failed`` is counted too, should a version send it). A ``turn.failed`` or a
top-level ``error`` event means the model's side failed: the provider answered
with an error, the stream broke or idled, or the key was missing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MAX_LINE = 1 << 20
# No real turn spends a trillion tokens: a larger count is noise (or an attack), not usage.
MAX_TOKENS = 10**12
USAGE_FIELDS = ("input_tokens", "cached_input_tokens", "cache_write_input_tokens", "output_tokens",
                "reasoning_output_tokens")
# The error message's tell-tale, first match wins, to a public class (messages are never kept).
_ERROR_CLASSES = (
    ("missing environment variable", "missing_key"),
    ("idle timeout", "stream_idle_timeout"),
    ("stream disconnected", "stream_disconnected"),
    ("stream closed", "stream_disconnected"),
    ("unauthorized", "auth_refused"),
    ("401", "auth_refused"),
    ("quota", "quota_or_rate_limit"),
    ("rate limit", "quota_or_rate_limit"),
    ("429", "quota_or_rate_limit"),
)


@dataclass(frozen=True)
class TokenCounts:
    """Codex's usage fields, summed over every turn (what the rate card prices)."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    output_tokens: int = 0
    reasoning_output_tokens: int = 0

    @property
    def total(self) -> int:
        """What ``--max-tokens`` counts: every token sent and received (cached ones included)."""
        return self.input_tokens + self.output_tokens

    def tokens_only(self) -> TokenCounts:
        return TokenCounts(**{field: getattr(self, field) for field in USAGE_FIELDS})


@dataclass(frozen=True)
class CodexUsage(TokenCounts):
    turns: int = 0
    failed_turns: int = 0
    model_error: str | None = None  # a class from _ERROR_CLASSES, or "provider_error"


def count_of(usage: dict, key: str) -> int:
    """A usage field as codex reported it, or 0 when it is not a plausible count."""
    value = usage.get(key, 0)
    plausible = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS
    return value if plausible else 0


def error_class(message: object) -> str:
    text = message.lower() if isinstance(message, str) else ""
    return next((label for tell, label in _ERROR_CLASSES if tell in text), "provider_error")


def jsonl_lines(path: Path):
    """The lines of a JSONL file, each at most ``MAX_LINE`` bytes; an over-long line is skipped whole."""
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


def _message(event: dict) -> object:
    error = event.get("error")
    return error.get("message") if isinstance(error, dict) else event.get("message")


def usage_from_events(path: Path) -> CodexUsage:
    """Sum the usage of every turn event; classify the last model failure; other lines are ignored."""
    totals = dict.fromkeys(USAGE_FIELDS, 0)
    turns = failed = 0
    model_error: str | None = None
    if not path.exists():
        return CodexUsage()
    for line in jsonl_lines(path):
        if b'"turn.' not in line and b'"error"' not in line:
            continue
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, a number of thousands of digits, too deep
            continue
        if not isinstance(event, dict):
            continue
        kind = event.get("type")
        if kind == "turn.completed":
            turns += 1
        elif kind == "turn.failed":
            failed += 1
            model_error = error_class(_message(event))
        elif kind == "error":  # a stream-level error; the turn.failed after it names the same
            model_error = model_error or error_class(_message(event))
            continue
        else:
            continue
        usage = event.get("usage")
        if isinstance(usage, dict):
            for key in totals:
                totals[key] = min(totals[key] + count_of(usage, key), MAX_TOKENS)
    return CodexUsage(turns=turns, failed_turns=failed, model_error=model_error, **totals)
