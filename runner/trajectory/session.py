"""What codex's session record (its rollout, ``agent-home/codex-home/sessions/**/rollout-*.jsonl``)
adds to the exec stream: where each model response ends, its usage, and when each item ran.

``codex exec --json`` has no timestamps, no durations and one usage for the whole turn; the
session record has a ``token_usage_record`` per model response, and an ``item_completed`` per
item with ``started_at_ms``/``completed_at_ms``. Tolerant as the stream's reader is: a line or
a field it does not know is passed over (the exec stream, not this record, is what is kept raw).

Pure: reads only the record it finds under the CODEX_HOME it is given, bounded per line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from runner.bounded_read import iter_bounded_lines
from runner.codex_meter import SESSIONS
from runner.codex_usage import MAX_LINE, TokenCounts
from runner.errors import UnreadableFileError
from runner.trajectory.events import AGENT_MESSAGE, COMMAND, FILE_CHANGE, REASONING, usage_of

MAX_RECORD_BYTES = 1 << 30
# The session record's item types (event_msg item_completed), to the exec stream's kinds.
_RECORD_KINDS = {"AgentMessage": AGENT_MESSAGE, "CommandExecution": COMMAND, "FileChange": FILE_CHANGE,
                 "Reasoning": REASONING}
# Response items that the model sent (each belongs to the response that the next usage record closes).
_MODEL_OUTPUTS = frozenset({"message", "function_call", "custom_tool_call", "local_shell_call", "reasoning",
                            "web_search_call"})


@dataclass(frozen=True)
class ModelResponse:
    usage: TokenCounts
    timestamp: str | None


@dataclass(frozen=True)
class Completed:
    """One item_completed of the record: the model output it answers, and when it ran."""

    ref: str  # the response item's id (a message) or call id (a tool call)
    started_ms: int | None
    completed_ms: int | None

    @property
    def seconds(self) -> float | None:
        if self.started_ms is None or self.completed_ms is None:
            return None
        return max(0, self.completed_ms - self.started_ms) / 1000


@dataclass
class SessionRecord:
    responses: list[ModelResponse] = field(default_factory=list)
    response_of: dict[str, int] = field(default_factory=dict)  # output id or call id -> response index
    completed: dict[str, list[Completed]] = field(default_factory=dict)  # kind -> in order
    model: str | None = None
    first_timestamp: str | None = None
    last_timestamp: str | None = None


def find_record(codex_home: Path) -> Path | None:
    """The session record of the run (the first, if codex wrote several)."""
    sessions = codex_home / SESSIONS
    if not sessions.is_dir() or sessions.is_symlink():
        return None
    found = sorted(p for p in sessions.rglob("rollout-*.jsonl") if p.is_file() and not p.is_symlink())
    return found[0] if found else None


def _ms(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_session_record(codex_home: Path, *, root: Path) -> SessionRecord | None:
    """The record under ``codex_home`` (inside ``root``); None when there is none or it cannot be read."""
    path = find_record(codex_home)
    if path is None:
        return None
    record = SessionRecord()
    pending = 0  # the response the model outputs seen now belong to
    token_counts: list[ModelResponse] = []  # the fallback boundary, for a version without usage records
    try:
        for line in iter_bounded_lines(path, root=root, max_line_bytes=MAX_LINE, max_total_bytes=MAX_RECORD_BYTES):
            if line.data is None:
                continue
            try:
                entry = json.loads(line.data)
            except (ValueError, RecursionError):
                continue
            if not isinstance(entry, dict):
                continue
            stamp = entry.get("timestamp") if isinstance(entry.get("timestamp"), str) else None
            record.first_timestamp = record.first_timestamp or stamp
            record.last_timestamp = stamp or record.last_timestamp
            payload = entry.get("payload")
            if not isinstance(payload, dict):
                continue
            kind, what = entry.get("type"), payload.get("type")
            if kind == "response_item" and what in _MODEL_OUTPUTS and payload.get("role") in (None, "assistant"):
                for key in ("id", "call_id"):
                    if isinstance(payload.get(key), str):
                        record.response_of.setdefault(payload[key], pending)
            elif kind == "token_usage_record":
                usage = usage_of(payload.get("usage"))
                if usage is not None:
                    record.responses.append(ModelResponse(usage, stamp))
                    pending = len(record.responses)
            elif kind == "turn_context" and isinstance(payload.get("model"), str):
                record.model = record.model or payload["model"]
            elif kind == "event_msg" and what == "item_completed" and isinstance(payload.get("item"), dict):
                item = payload["item"]
                mapped = _RECORD_KINDS.get(str(item.get("type")))
                if mapped is not None and isinstance(item.get("id"), str):
                    record.completed.setdefault(mapped, []).append(
                        Completed(item["id"], _ms(payload.get("started_at_ms")), _ms(payload.get("completed_at_ms"))))
            elif kind == "event_msg" and what == "token_count":
                info = payload.get("info")
                last = usage_of(info.get("last_token_usage")) if isinstance(info, dict) else None
                if last is not None:
                    token_counts.append(ModelResponse(last, stamp))
    except UnreadableFileError:
        return None
    if not record.responses and token_counts:  # no response boundaries: usage counts only, grouping by the stream
        record.responses, record.response_of = token_counts, {}
    return record
