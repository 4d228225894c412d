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


def test_failed_turns_count_their_usage_and_the_newer_fields(tmp_path: Path) -> None:
    log = tmp_path / "codex.stdout.log"
    events = [
        {"type": "turn.completed", "usage": {"input_tokens": 10, "cached_input_tokens": 4, "cache_write_input_tokens": 2,
                                             "output_tokens": 3, "reasoning_output_tokens": 1}},
        {"type": "error", "message": "stream disconnected before completion: idle timeout waiting for SSE"},
        {"type": "turn.failed", "error": {"message": "stream disconnected before completion: idle timeout waiting for SSE"},
         "usage": {"input_tokens": 5, "output_tokens": 10**20}},
    ]
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    usage = usage_from_events(log)
    assert (usage.input_tokens, usage.cached_input_tokens, usage.cache_write_input_tokens) == (15, 4, 2)
    assert (usage.output_tokens, usage.reasoning_output_tokens) == (3, 1)  # an absurd count is dropped
    assert (usage.turns, usage.failed_turns, usage.model_error) == (1, 1, "stream_idle_timeout")


def test_model_error_classes() -> None:
    from runner.codex_usage import error_class

    assert error_class("Missing environment variable: `X`.") == "missing_key"
    assert error_class("stream disconnected before completion: stream closed before response.completed") == (
        "stream_disconnected"
    )
    assert error_class("We're currently experiencing high demand") == "provider_error"
    assert error_class(None) == "provider_error"


def test_an_item_error_is_not_a_model_failure(tmp_path: Path) -> None:
    log = tmp_path / "codex.stdout.log"
    item = {"type": "item.completed", "item": {"type": "error", "message": "Model metadata not found"}}
    log.write_text(json.dumps(item) + "\n" + json.dumps({"type": "turn.completed", "usage": {}}) + "\n")
    assert usage_from_events(log).model_error is None
