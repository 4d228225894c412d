"""The agent seam without a real CLI: the registry, Claude Code's argv, environment and usage,
and the scripted model's Anthropic Messages stream read back over a real socket."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest

from runner.agents import AgentName, agent_for
from runner.agents.claude_code import (
    DISALLOWED_TOOLS,
    SHELL_PREFIX,
    StreamMeter,
    bwrap_path,
    child_environment,
    claude_argv,
    confined,
)
from runner.canary.model_server import ANTHROPIC_TURN_USAGE, ScriptedModel, exec_call, fault, message, turn
from runner.errors import BadInputError
from runner.tasks.spec import load_settings


def test_each_agent_has_one_implementation_and_an_unknown_name_is_refused() -> None:
    assert agent_for("codex").name is AgentName.CODEX
    assert agent_for("claude-code").name is AgentName.CLAUDE_CODE
    with pytest.raises(BadInputError, match="claude-code"):
        agent_for("gemini")


def test_the_agent_is_a_task_setting_and_codex_the_default() -> None:
    assert load_settings().agent is AgentName.CODEX
    assert load_settings(agent="claude-code").agent is AgentName.CLAUDE_CODE
    with pytest.raises(BadInputError, match="--agent"):
        load_settings(agent="gemini")


def test_claude_codes_permissions_are_the_runners_and_no_settings_file_is_loaded() -> None:
    argv = claude_argv("/usr/bin/claude", model="m-1")
    settings = json.loads(argv[argv.index("--settings") + 1])
    assert argv[argv.index("--setting-sources") + 1] == ""  # neither the operator's nor the task repo's
    assert argv[argv.index("--permission-mode") + 1] == "dontAsk"
    assert "--strict-mcp-config" in argv and "--dangerously-skip-permissions" not in argv
    assert settings["permissions"]["disableBypassPermissionsMode"] == "disable"
    assert set(DISALLOWED_TOOLS) <= set(settings["permissions"]["deny"]) and settings["disableAllHooks"] is True
    assert argv[-2:] == ["--model", "m-1"]


def test_claude_code_runs_read_only_but_for_its_tree_and_home(tmp_path: Path) -> None:
    tree, home = tmp_path / "buggy-source", tmp_path / "agent-home"
    argv = confined(["claude", "-p"], "/usr/bin/bwrap", (tree, home))
    assert argv[:3] == ["/usr/bin/bwrap", "--ro-bind", "/"]
    assert argv[argv.index("--tmpfs") + 1] == "/tmp"
    binds = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--bind"]
    assert binds == [str(tree), str(home)] and argv[-3:] == ["--", "claude", "-p"]
    # the shell prefix every command starts in stays visible even when the runner lives under /tmp
    # (a clone there: CI's), since the private /tmp would hide it
    ro = [i for i, arg in enumerate(argv) if arg == "--ro-bind" and argv[i + 1] == str(SHELL_PREFIX)]
    assert ro and ro[0] > argv.index("--tmpfs")


def test_claude_codes_environment_is_an_allowlist_with_the_key_dropped_from_its_commands(tmp_path: Path) -> None:
    environ = {"PATH": "/bin", "ANTHROPIC_API_KEY": "sk-1", "AWS_SECRET_ACCESS_KEY": "no", "HOME": "/root",
               "CLAUDE_CONFIG_DIR": "/root/.claude", "CLAUDE_CODE_SHELL_PREFIX": "evil", "LC_ALL": "C"}
    env = child_environment(environ, tmp_path)
    assert env["ANTHROPIC_API_KEY"] == "sk-1" and "AWS_SECRET_ACCESS_KEY" not in env and env["LC_ALL"] == "C"
    assert env["HOME"] == str(tmp_path) and env["CLAUDE_CONFIG_DIR"] == str(tmp_path / ".claude")
    assert env["CLAUDE_CODE_SHELL_PREFIX"] == str(SHELL_PREFIX) and env["DISABLE_TELEMETRY"] == "1"
    assert "unset ANTHROPIC_API_KEY ANTHROPIC_AUTH_TOKEN" in SHELL_PREFIX.read_text()


def test_the_shell_prefix_runs_a_command_offline_or_not_at_all(tmp_path: Path) -> None:
    """In the runner's bubblewrap, a command finds only a loopback that is down; where no network
    namespace can be made (user namespaces disabled), the command does not run at all."""
    bwrap = bwrap_path(load_settings())
    if bwrap is None:
        pytest.skip("no bubblewrap (bwrap on PATH or the Codex CLI's own)")
    marker = tmp_path / "ran"
    command = f"grep -c : /proc/net/dev > {marker}"
    offline = subprocess.run(confined([str(SHELL_PREFIX), command], bwrap, (tmp_path,)), capture_output=True, timeout=30)
    assert offline.returncode == 0, offline.stderr
    assert marker.read_text().strip() == "1"  # the loopback alone; the host has more
    marker.unlink()
    refused = subprocess.run([bwrap, "--unshare-user", "--disable-userns", "--ro-bind", "/", "/", "--dev", "/dev",
                              "--proc", "/proc", "--bind", str(tmp_path), str(tmp_path), "--", str(SHELL_PREFIX), command],
                             capture_output=True, timeout=30)
    assert refused.returncode == 126 and b"no network namespace" in refused.stderr
    assert not marker.exists()


def _events(*lines: dict) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def test_the_stream_meter_sums_messages_then_takes_the_results_totals(tmp_path: Path) -> None:
    stdout = tmp_path / "out.jsonl"
    usage = {"input_tokens": 10, "cache_read_input_tokens": 4, "cache_creation_input_tokens": 2, "output_tokens": 1}
    stdout.write_bytes(_events({"type": "system"}, {"type": "assistant", "message": {"id": "m1", "usage": usage}},
                               {"type": "assistant", "message": {"id": "m1", "usage": usage}}))  # one message, twice
    meter = StreamMeter(stdout)
    first = meter.poll()
    assert (first.input_tokens, first.cached_input_tokens, first.cache_write_input_tokens) == (10, 4, 2)
    with stdout.open("ab") as sink:
        sink.write(_events({"type": "assistant", "message": {"id": "m2", "usage": usage}}) + b'{"type": "assis')
    assert meter.poll().input_tokens == 20  # the half-written line waits
    with stdout.open("ab") as sink:
        sink.write(b'tant"}\n' + _events({"type": "result", "num_turns": 2, "usage": {**usage, "output_tokens": 30}}))
    final = meter.poll()
    assert final.input_tokens == 10 and final.output_tokens == 30 and meter.result["num_turns"] == 2


def _stream(model: ScriptedModel, body: dict) -> list[dict]:
    request = urllib.request.Request(f"{model.anthropic_base_url}/v1/messages?beta=true", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read().decode()
    return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]


def test_the_scripted_model_speaks_anthropics_stream_and_steps_by_tool_results() -> None:
    script = [turn(exec_call("echo hi")), turn(message("done"))]
    tools = [{"name": "Bash"}]
    with ScriptedModel(script, per_conversation=True) as model:
        side = _stream(model, {"model": "m", "messages": [{"role": "user", "content": "title?"}]})
        first = _stream(model, {"model": "m", "tools": tools, "messages": [{"role": "user", "content": "go"}]})
        result = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "hi"}]}]
        second = _stream(model, {"model": "m", "tools": tools, "messages": result})
        assert model.side_requests == 1 and model.requests == 2 and model.completed == 2
    assert [e["type"] for e in first] == ["message_start", "content_block_start", "content_block_delta",
                                          "content_block_stop", "message_delta", "message_stop"]
    assert first[0]["message"]["usage"]["cache_read_input_tokens"] == ANTHROPIC_TURN_USAGE["cache_read_input_tokens"]
    assert first[1]["content_block"]["type"] == "tool_use" and first[1]["content_block"]["name"] == "Bash"
    assert json.loads(first[2]["delta"]["partial_json"]) == {"command": "echo hi"}
    assert first[4]["delta"]["stop_reason"] == "tool_use" and first[4]["usage"]["output_tokens"] == 20
    assert second[2]["delta"] == {"type": "text_delta", "text": "done"} and second[4]["delta"]["stop_reason"] == "end_turn"
    assert side[2]["delta"]["type"] == "text_delta"  # answered, without taking a step of the script


def test_the_scripted_model_fails_on_anthropics_side_too() -> None:
    with ScriptedModel([fault("http_500")]) as model:
        with pytest.raises(urllib.error.HTTPError) as caught:
            _stream(model, {"model": "m", "tools": [{"name": "Bash"}], "messages": []})
    assert caught.value.code == 500


def test_the_plan_shows_the_chosen_agents_argv() -> None:
    from runner.plan import build_plan

    codex = next(p for p in build_plan(load_settings())["phases"] if p["phase"] == "codex")
    claude = next(p for p in build_plan(load_settings(agent="claude-code"))["phases"] if p["phase"] == "codex")
    assert codex["argv"][:2] == ["codex", "exec"]
    assert claude["argv"][0] == "bwrap" and ["claude", "-p"] == claude["argv"][claude["argv"].index("--") + 1:][:2]
