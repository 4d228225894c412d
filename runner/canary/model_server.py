"""A scripted model: a local server that speaks the OpenAI Responses API the way codex reads it,
and the Anthropic Messages API the way Claude Code reads it.

The canary and the integration tests point the real Codex CLI at it (through a
``CODEX_HOME/config.toml`` provider), so the whole pipeline runs with no
credentials, no network and no tokens spent. It binds 127.0.0.1 on an ephemeral
port and answers each ``POST {base}/responses`` with the next turn of its script.

Wire format (measured against codex-cli 0.171.0): a Server-Sent Events stream of
one ``response.output_item.done`` per output item (a ``function_call`` with
``name``, ``arguments`` as a JSON string and ``call_id``, or an assistant
``message``), then ``response.completed`` whose ``response.usage`` carries
``input_tokens``, ``input_tokens_details.cached_tokens``, ``output_tokens``,
``output_tokens_details.reasoning_tokens`` and ``total_tokens``.

The same script is served in Anthropic's wire format on ``POST {base}/messages``
(``anthropic_base_url``; measured against Claude Code 2.1.197): ``message_start`` (whose
``message.usage`` carries ``input_tokens``, ``cache_read_input_tokens`` and
``cache_creation_input_tokens``), per item a ``content_block_start`` / ``content_block_delta``
/ ``content_block_stop`` (an ``exec_call`` becomes a ``tool_use`` block of the ``Bash`` tool
with ``{"command": ...}``, a ``message`` a ``text`` block), ``message_delta`` with the
``stop_reason`` and ``usage.output_tokens``, then ``message_stop``. Only a request that offers
tools is the agent's conversation; any other (a title, a summary) gets a short text answer and
does not advance the script.

A script is data: a list of turns, each a dict with either ``items`` (built with
``exec_call`` / ``message``) or a ``fault``: ``http_500`` (an error status),
``malformed`` (a stream that is not JSON), ``cut`` (the stream ends without
``response.completed``) or ``hang`` (headers, then silence until the server stops).
When the script is used up, every further request gets a closing message.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FAULTS = frozenset({"http_500", "malformed", "cut", "hang"})
PROVIDER = "runner_scripted"
MODEL = "runner-scripted-model"
KEY_VARIABLE = "RUNNER_SCRIPTED_MODEL_KEY"
# Every turn spends these; tests check the runner sums them over turns.
TURN_USAGE = {
    "input_tokens": 100,
    "input_tokens_details": {"cached_tokens": 40},
    "output_tokens": 20,
    "output_tokens_details": {"reasoning_tokens": 5},
    "total_tokens": 120,
}


# What each Anthropic-format turn spends (disjoint counts: input excludes the cache's).
ANTHROPIC_TURN_USAGE = {"input_tokens": 60, "cache_read_input_tokens": 30, "cache_creation_input_tokens": 10,
                        "output_tokens": 20}


def exec_call(cmd: str) -> dict[str, Any]:
    """An ``exec_command`` tool call, as the model would send it."""
    return {"type": "function_call", "name": "exec_command", "arguments": json.dumps({"cmd": cmd})}


def message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def turn(*items: Mapping[str, Any], thinking_seconds: float = 0) -> dict[str, Any]:
    """``thinking_seconds``: the stream opens, then stays silent that long before the items (a slow model)."""
    return {"items": [dict(item) for item in items], **({"thinking_seconds": thinking_seconds} if thinking_seconds else {})}


def fault(kind: str) -> dict[str, Any]:
    if kind not in FAULTS:
        raise ValueError(f"unknown fault {kind!r}; one of {sorted(FAULTS)}")
    return {"fault": kind}


def _sse(event: Mapping[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


class ScriptedModel:
    """The server; use as a context manager. ``requests`` counts the POSTs it answered.

    ``per_conversation``: every conversation (a codex run) gets the whole script, its step
    chosen by how many tool results the request carries, so concurrent runs (a batch's
    workers) each see the same turns in order; by default one script is shared by every request.
    """

    def __init__(self, script: Sequence[Mapping[str, Any]], *, final_text: str = "done",
                 per_conversation: bool = False) -> None:
        for step in script:
            if "fault" in step and step["fault"] not in FAULTS:
                raise ValueError(f"unknown fault {step['fault']!r}")
        self._script = list(script)
        self._per_conversation = per_conversation
        self._final = turn(message(final_text))
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self.requests = 0
        self.side_requests = 0  # Anthropic-format requests outside the agent's conversation
        self.completed = 0  # responses sent whole, usage and all
        self.bodies: list[dict[str, Any]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-model", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> ScriptedModel:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()  # releases a hanging stream
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    @property
    def anthropic_base_url(self) -> str:
        """What ``ANTHROPIC_BASE_URL`` names: Claude Code adds ``/v1/messages`` itself."""
        return f"http://127.0.0.1:{self.port}"

    def _next(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.requests += 1
            self.bodies.append(body)
            if self._per_conversation:
                step = _tool_results(body)
                return self._script[step] if step < len(self._script) else self._final
            return self._script.pop(0) if self._script else self._final

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: object) -> None:  # quiet: the test's output stays readable
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {}
                body = body if isinstance(body, dict) else {}
                path = self.path.split("?", 1)[0].rstrip("/")
                if path.endswith("/messages"):
                    self._anthropic(body)
                    return
                if path.endswith("/messages/count_tokens"):
                    self._plain(200, b'{"input_tokens": 100}')
                    return
                if not path.endswith("/responses"):
                    self._plain(404, b'{"error": {"message": "only /responses and /messages are served"}}')
                    return
                step = model._next(body)
                kind = step.get("fault")
                error = b'{"error": {"message": "scripted internal error", "type": "server_error"}}'
                if not self._stream_opened(step, error, b"response.output_item.done"):
                    return
                response_id = f"resp_{next(model._ids)}"
                for item in step.get("items", []):
                    self.wfile.write(_sse({"type": "response.output_item.done", "item": model._complete(item)}))
                if kind == "cut":
                    self.wfile.flush()
                    return
                completed = {"id": response_id, "status": "completed", "usage": TURN_USAGE}
                self.wfile.write(_sse({"type": "response.completed", "response": completed}))
                self.wfile.flush()
                with model._lock:
                    model.completed += 1

            def _anthropic(self, body: dict[str, Any]) -> None:
                """One Messages API answer: the script's next turn to the agent's conversation."""
                if not body.get("tools"):  # a side request of the CLI (a title, a summary)
                    with model._lock:
                        model.side_requests += 1
                    step: Mapping[str, Any] = turn(message("ok"))
                else:
                    step = model._next(body)
                kind = step.get("fault")
                error = b'{"type": "error", "error": {"type": "api_error", "message": "scripted internal error"}}'
                if not self._stream_opened(step, error, b"message_start"):
                    return
                for event in model._anthropic_events(step, str(body.get("model") or MODEL)):
                    if kind == "cut" and event["type"] == "message_delta":
                        self.wfile.flush()
                        return
                    self.wfile.write(_sse(event))
                self.wfile.flush()
                if body.get("tools"):
                    with model._lock:
                        model.completed += 1

            def _stream_opened(self, step: Mapping[str, Any], error: bytes, first_event: bytes) -> bool:
                """The step's fault, or the event stream's headers and its thinking time; False: nothing more to send."""
                kind = step.get("fault")
                if kind == "http_500":
                    self._plain(500, error)
                    return False
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                if kind == "hang":
                    self.wfile.flush()
                    model._stop.wait()
                    return False
                if kind == "malformed":
                    self.wfile.write(b"event: " + first_event + b"\ndata: {this is not json\n\n")
                    self.wfile.flush()
                    return False
                if step.get("thinking_seconds"):
                    self.wfile.flush()
                    if model._stop.wait(float(step["thinking_seconds"])):
                        return False
                return True

            def _plain(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.send_header("connection", "close")
                self.end_headers()
                self.wfile.write(payload)

        return Handler

    def _anthropic_events(self, step: Mapping[str, Any], model_name: str) -> list[dict[str, Any]]:
        """A turn as the Messages API streams it: message_start, a block per item, message_delta, message_stop."""
        usage = dict(ANTHROPIC_TURN_USAGE)
        start_usage = {**usage, "output_tokens": 1}
        events: list[dict[str, Any]] = [{
            "type": "message_start",
            "message": {"id": f"msg_{next(self._ids)}", "type": "message", "role": "assistant", "model": model_name,
                        "content": [], "stop_reason": None, "stop_sequence": None, "usage": start_usage},
        }]
        stop_reason = "end_turn"
        for index, item in enumerate(step.get("items", [])):
            if item.get("type") == "function_call":
                stop_reason = "tool_use"
                arguments = json.loads(item.get("arguments") or "{}")
                block = {"type": "tool_use", "id": f"toolu_{next(self._ids)}", "name": "Bash", "input": {}}
                delta = {"type": "input_json_delta", "partial_json": json.dumps({"command": arguments.get("cmd", "")})}
            else:
                text = "".join(part.get("text", "") for part in item.get("content", []) if isinstance(part, dict))
                block = {"type": "text", "text": ""}
                delta = {"type": "text_delta", "text": text}
            events += [
                {"type": "content_block_start", "index": index, "content_block": block},
                {"type": "content_block_delta", "index": index, "delta": delta},
                {"type": "content_block_stop", "index": index},
            ]
        events += [
            {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None},
             "usage": {"output_tokens": usage["output_tokens"]}},
            {"type": "message_stop"},
        ]
        return events

    def _complete(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """Ids codex expects on each item (``call_id`` for calls)."""
        out = dict(item)
        n = next(self._ids)
        out.setdefault("id", f"item_{n}")
        if out.get("type") == "function_call":
            out.setdefault("call_id", f"call_{n}")
        return out


def _tool_results(body: Mapping[str, Any]) -> int:
    """How many tool results a request carries: the conversation's step, in either wire format."""
    items = body.get("input")
    if isinstance(items, list):  # Responses
        return sum(1 for item in items if isinstance(item, dict) and item.get("type") == "function_call_output")
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 0
    return sum(
        1 for entry in messages if isinstance(entry, dict) and isinstance(entry.get("content"), list)
        for block in entry["content"] if isinstance(block, dict) and block.get("type") == "tool_result"
    )


def provider_config(base_url: str, *, idle_timeout_ms: int = 5000) -> str:
    """``config.toml`` text that makes codex use the scripted model, with no retries."""
    return (
        f'model = "{MODEL}"\n'
        f'model_provider = "{PROVIDER}"\n\n'
        f"[model_providers.{PROVIDER}]\n"
        f'name = "scripted model (runner canary)"\n'
        f'base_url = "{base_url}"\n'
        'wire_api = "responses"\n'
        f'env_key = "{KEY_VARIABLE}"\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n"
        f"stream_idle_timeout_ms = {idle_timeout_ms}\n"
    )


def write_codex_home(directory: Path, base_url: str, *, idle_timeout_ms: int = 5000) -> Path:
    """A fresh CODEX_HOME holding only the scripted provider's config."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.toml").write_text(provider_config(base_url, idle_timeout_ms=idle_timeout_ms))
    return directory


def apply_patch_command(patch_body: str) -> str:
    """An ``apply_patch`` heredoc, which codex applies as a file change when sent through exec_command."""
    return f"apply_patch <<'PATCH'\n*** Begin Patch\n{patch_body}*** End Patch\nPATCH"

