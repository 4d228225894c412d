"""A tolerant reader of ``codex exec --json``'s event stream (``logs/codex.stdout.log``).

Codex's stream changes with its versions, so the reader assumes as little as it can:
- an event is a JSON object with a ``type``; the ones it knows are read field by field, each
  field optional (a missing text is ``None``, a count that is not a plausible integer is 0);
- an item is known by its ``id``: ``item.started``/``item.updated``/``item.completed`` update
  the one item in place, in the order it first appeared, so a running attempt shows its
  in-progress command;
- anything it does not know (an event type, an item type, a line that is not JSON, an
  over-long line) is kept as a ``RawEvent`` at the place it came, never dropped;
- the older envelope (``{"id": ..., "msg": {"type": "agent_message", ...}}``, codex before the
  ``thread.*``/``item.*`` stream) is read too, for its messages, commands and usage.

Pure: reads the one file it is given, bounded per line and in total (``runner.bounded_read``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from runner.bounded_read import iter_bounded_lines
from runner.codex_usage import MAX_LINE, USAGE_FIELDS, TokenCounts, count_of

MAX_STREAM_BYTES = 1 << 30  # codex's stdout log of one attempt; past that it is not a stream a run writes

# Item types as codex has spelled them, to one kind each (a type not here keeps its own name).
AGENT_MESSAGE, REASONING, COMMAND, FILE_CHANGE, TOOL_CALL, ERROR = (
    "agent_message", "reasoning", "command_execution", "file_change", "tool_call", "error")
_ITEM_KINDS = {
    "agent_message": AGENT_MESSAGE, "assistant_message": AGENT_MESSAGE, "message": AGENT_MESSAGE,
    "reasoning": REASONING,
    "command_execution": COMMAND, "local_shell_call": COMMAND,
    "file_change": FILE_CHANGE, "patch_apply": FILE_CHANGE,
    "mcp_tool_call": TOOL_CALL, "web_search": TOOL_CALL, "tool_call": TOOL_CALL,
    "error": ERROR,
}
TOOL_KINDS = frozenset({COMMAND, FILE_CHANGE, TOOL_CALL})


@dataclass(frozen=True)
class FileChange:
    path: str
    kind: str  # add, update, delete, or what codex said


@dataclass(frozen=True)
class StreamItem:
    """One item of the stream as codex last described it."""

    id: str
    kind: str  # one of the kinds above, or codex's own type name for one the reader does not know
    status: str | None = None  # in_progress, completed, failed, declined, ...
    text: str | None = None  # a message's or reasoning's text, an error's message
    command: str | None = None
    output: str | None = None  # a command's aggregated output
    exit_code: int | None = None
    changes: tuple[FileChange, ...] = ()
    duration_seconds: float | None = None  # from the session record where codex's stream has none
    completed: bool = False
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def failed(self) -> bool:
        return self.status == "failed" or (self.exit_code is not None and self.exit_code != 0)


@dataclass(frozen=True)
class RawEvent:
    """A line the reader did not map: kept with where it came (``after_items`` items had appeared)."""

    line: int
    after_items: int
    event: Any  # the parsed JSON value, or the line's text when it was not JSON (None: over-long)
    why: str  # unknown_event, unknown_item, not_json, too_long


@dataclass(frozen=True)
class CodexTurn:
    """One ``turn.started`` .. ``turn.completed``/``turn.failed`` of codex (one prompt)."""

    usage: TokenCounts | None = None
    failed: bool = False
    error: str | None = None
    ended: bool = False


@dataclass
class ExecStream:
    thread_id: str | None = None
    items: list[StreamItem] = field(default_factory=list)
    turns: list[CodexTurn] = field(default_factory=list)
    raw_events: list[RawEvent] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # top-level ``error`` events' messages
    lines: int = 0
    torn_tail: bool = False  # the last line had no newline yet (codex still writing it)

    @property
    def usage(self) -> TokenCounts:
        """The usage codex reported, summed over its turns (failed ones included)."""
        totals = dict.fromkeys(USAGE_FIELDS, 0)
        for turn in self.turns:
            if turn.usage is not None:
                for key in totals:
                    totals[key] += getattr(turn.usage, key)
        return TokenCounts(**totals)

    @property
    def reported_usage(self) -> bool:
        return any(turn.usage is not None for turn in self.turns)


def _text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: [{"type": "output_text", "text": ...}]
        parts = [part.get("text") for part in value if isinstance(part, dict) and isinstance(part.get("text"), str)]
        return "".join(parts) if parts else None
    return None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _command(value: object) -> str | None:
    if isinstance(value, list) and all(isinstance(part, str) for part in value):
        return " ".join(value)
    return value if isinstance(value, str) else None


def _changes(value: object) -> tuple[FileChange, ...]:
    if isinstance(value, list):  # [{"path": ..., "kind": ...}]
        return tuple(FileChange(str(c.get("path")), str(c.get("kind") or c.get("type") or "update"))
                     for c in value if isinstance(c, dict) and c.get("path") is not None)
    if isinstance(value, dict):  # {path: {"type": "update", ...}} (the older and the session record's shape)
        return tuple(FileChange(str(path), str((spec.get("type") or spec.get("kind") or "update")
                                               if isinstance(spec, dict) else "update"))
                     for path, spec in value.items())
    return ()


def usage_of(value: object) -> TokenCounts | None:
    """A usage object's counts (codex's field names), None when it is not one."""
    if not isinstance(value, dict):
        return None
    return TokenCounts(**{key: count_of(value, key) for key in USAGE_FIELDS})


def _seconds(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict) and isinstance(value.get("secs"), int):  # {"secs": 1, "nanos": 5}
        return value["secs"] + (value.get("nanos") or 0) / 1e9
    return None


def item_from(raw: Mapping[str, Any], *, completed: bool, earlier: StreamItem | None = None) -> StreamItem | None:
    """A ``thread.*`` stream's item; None when it has no id."""
    item_id = raw.get("id")
    if not isinstance(item_id, (str, int)):
        return None
    codex_type = raw.get("type") or raw.get("item_type") or "unknown"
    kind = _ITEM_KINDS.get(str(codex_type), str(codex_type))
    text = _text(raw.get("text")) or _text(raw.get("message")) or _text(raw.get("content")) or _text(raw.get("summary"))
    milliseconds = _seconds(raw.get("duration_ms"))
    found = StreamItem(
        id=str(item_id), kind=kind, status=raw.get("status") if isinstance(raw.get("status"), str) else None,
        text=text, command=_command(raw.get("command")),
        output=_text(raw.get("aggregated_output")) if raw.get("aggregated_output") is not None else _text(raw.get("output")),
        exit_code=_int(raw.get("exit_code")), changes=_changes(raw.get("changes")),
        duration_seconds=milliseconds / 1000 if milliseconds is not None else _seconds(raw.get("duration")),
        completed=completed, raw=dict(raw),
    )
    if kind == TOOL_CALL and found.command is None:  # an MCP call or a search: name what was called
        name = raw.get("tool") or raw.get("query") or raw.get("name")
        found = replace(found, command=str(name) if name is not None else None)
    if earlier is not None and found.duration_seconds is None:
        found = replace(found, duration_seconds=earlier.duration_seconds)
    return found


class _Reader:
    def __init__(self) -> None:
        self.stream = ExecStream()
        self._index: dict[str, int] = {}
        self._turn_open = False

    def _put(self, item: StreamItem) -> None:
        at = self._index.get(item.id)
        if at is None:
            self._index[item.id] = len(self.stream.items)
            self.stream.items.append(item)
        else:
            self.stream.items[at] = item

    def keep_raw(self, line: int, event: Any, why: str) -> None:
        self.stream.raw_events.append(RawEvent(line, len(self.stream.items), event, why))

    def _end_turn(self, turn: CodexTurn) -> None:
        if self._turn_open and self.stream.turns:
            self.stream.turns[-1] = turn
        else:
            self.stream.turns.append(turn)
        self._turn_open = False

    def feed(self, line: int, event: Any) -> None:
        if not isinstance(event, dict):
            self.keep_raw(line, event, "unknown_event")
            return
        if isinstance(event.get("msg"), dict) and "type" not in event:
            self._legacy(line, event, event["msg"])
            return
        kind = event.get("type")
        if kind == "thread.started":
            self.stream.thread_id = str(event.get("thread_id")) if event.get("thread_id") is not None else None
        elif kind == "turn.started":
            self.stream.turns.append(CodexTurn())
            self._turn_open = True
        elif kind == "turn.completed":
            self._end_turn(CodexTurn(usage=usage_of(event.get("usage")), ended=True))
        elif kind == "turn.failed":
            error = event.get("error")
            message = _text(error.get("message")) if isinstance(error, dict) else _text(event.get("message"))
            self._end_turn(CodexTurn(usage=usage_of(event.get("usage")), failed=True, error=message, ended=True))
        elif kind == "error":
            self.stream.errors.append(_text(event.get("message")) or "")
        elif kind in ("item.started", "item.updated", "item.completed"):
            raw = event.get("item")
            if not isinstance(raw, dict):
                self.keep_raw(line, event, "unknown_item")
                return
            item_id = str(raw.get("id"))
            earlier = self.stream.items[self._index[item_id]] if item_id in self._index else None
            item = item_from(raw, completed=kind == "item.completed", earlier=earlier)
            if item is None:
                self.keep_raw(line, event, "unknown_item")
                return
            self._put(item)
        else:
            self.keep_raw(line, event, "unknown_event")

    def _legacy(self, line: int, event: dict, msg: dict) -> None:
        """The envelope codex used before the ``thread.*`` stream."""
        kind = msg.get("type")
        call = str(msg.get("call_id") or event.get("id") or f"line-{line}")
        if kind == "agent_message":
            self._put(StreamItem(id=f"msg-{line}", kind=AGENT_MESSAGE, text=_text(msg.get("message")), completed=True,
                                 raw=msg))
        elif kind == "agent_reasoning":
            self._put(StreamItem(id=f"reasoning-{line}", kind=REASONING, text=_text(msg.get("text")), completed=True,
                                 raw=msg))
        elif kind == "exec_command_begin":
            self._put(StreamItem(id=call, kind=COMMAND, command=_command(msg.get("command")), status="in_progress",
                                 raw=msg))
        elif kind == "exec_command_end":
            earlier = self.stream.items[self._index[call]] if call in self._index else None
            exit_code = _int(msg.get("exit_code"))
            self._put(StreamItem(
                id=call, kind=COMMAND, command=earlier.command if earlier else _command(msg.get("command")),
                status="completed" if exit_code == 0 else "failed",
                output=_text(msg.get("aggregated_output")) or _text(msg.get("stdout")), exit_code=exit_code,
                duration_seconds=_seconds(msg.get("duration")), completed=True, raw=msg))
        elif kind == "patch_apply_begin":
            self._put(StreamItem(id=call, kind=FILE_CHANGE, changes=_changes(msg.get("changes")), status="in_progress",
                                 raw=msg))
        elif kind == "patch_apply_end":
            earlier = self.stream.items[self._index[call]] if call in self._index else None
            self._put(StreamItem(id=call, kind=FILE_CHANGE, changes=earlier.changes if earlier else (),
                                 status="completed" if msg.get("success", True) else "failed", completed=True, raw=msg))
        elif kind == "task_started":
            self.stream.turns.append(CodexTurn())
            self._turn_open = True
        elif kind == "token_count":
            info = msg.get("info")
            total = info.get("total_token_usage") if isinstance(info, dict) else msg
            usage = usage_of(total)
            if usage is not None:  # a running total: the turn's usage is the latest
                if not (self._turn_open and self.stream.turns):
                    self.stream.turns.append(CodexTurn())
                    self._turn_open = True
                self.stream.turns[-1] = CodexTurn(usage=usage)
        elif kind == "task_complete":
            last = self.stream.turns[-1] if self._turn_open and self.stream.turns else CodexTurn()
            self._end_turn(replace(last, ended=True))
        elif kind == "error":
            self.stream.errors.append(_text(msg.get("message")) or "")
        else:
            self.keep_raw(line, event, "unknown_event")


def read_exec_stream(path: Path, *, root: Path) -> ExecStream:
    """The stream at ``path`` (inside ``root``, the job root), as far as it is written.

    A last line without its newline is left for the next read while codex may still be writing it
    (``torn_tail``); every other line that cannot be read is kept as a ``RawEvent``.

    Raises:
        UnreadableFileError: the file is missing, a link out of the job root, not a regular file,
            or larger than ``MAX_STREAM_BYTES``.
    """
    reader = _Reader()
    for line in iter_bounded_lines(path, root=root, max_line_bytes=MAX_LINE, max_total_bytes=MAX_STREAM_BYTES):
        reader.stream.lines = line.number
        if line.data is None:
            reader.keep_raw(line.number, None, "too_long")
            continue
        if not line.data.strip():
            continue
        try:
            event = json.loads(line.data)
        except (ValueError, RecursionError):
            if not line.terminated:
                reader.stream.torn_tail = True
                continue
            reader.keep_raw(line.number, line.data.decode("utf-8", errors="replace"), "not_json")
            continue
        reader.feed(line.number, event)
    return reader.stream
