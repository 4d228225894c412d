"""Token counts from codex's JSONL events: summed over turns, robust to noise and floods."""

from __future__ import annotations

import json
from pathlib import Path

from runner.codex_usage import MAX_LINE, CodexUsage, usage_from_events


def test_usage_is_summed_over_completed_turns(tmp_path: Path) -> None:
    log = tmp_path / "codex.stdout.log"
    events = [
        {"type": "thread.started", "thread_id": "t"},
        {"type": "turn.completed", "usage": {"input_tokens": 100, "cached_input_tokens": 40, "output_tokens": 7}},
        {"type": "item.completed", "item": {"text": "turn.completed"}},
        {"type": "turn.completed", "usage": {"input_tokens": 50, "cached_input_tokens": 0, "output_tokens": 3}},
        {"type": "turn.completed", "usage": {"input_tokens": -5, "output_tokens": "many"}},
    ]
    lines = [json.dumps(e) for e in events]
    lines.insert(2, "not json turn.completed")
    lines.insert(3, '{"type": "turn.completed", "usage": ' + "x" * (MAX_LINE + 10) + "}")
    log.write_text("\n".join(lines) + "\n")
    assert usage_from_events(log) == CodexUsage(input_tokens=150, cached_input_tokens=40, output_tokens=10, turns=3)


def test_no_log_means_no_usage(tmp_path: Path) -> None:
    assert usage_from_events(tmp_path / "absent.log") == CodexUsage()
