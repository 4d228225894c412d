"""The fleet's parts without Docker: messages, the ledger's arithmetic, leases and submit on a real Redis."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from runner.agents import AgentName
from runner.fleet.hostchecks import AgentChecks, HostReport, check_host
from runner.fleet.ledger import LedgerRow, TaskState, summary
from runner.fleet.state import WorkerState
from runner.phases.precheck import Check, codex_login
from runner.tasks.protocol import MessageError, message_id, parse_message
from runner.tasks.spec import HostSettings
from tests.conftest import FAKE_CODEX, run_cli

SPEC = {"tag": "t_a", "codex_timeout": 10, "eval_timeout": 10, "eval_network": "bridge", "source_dir": "/app",
        "apply_cmd": "true", "test_cmd": "true"}


def _payload(**change: object) -> dict:
    return {"suite": "s1", "attempt": 1, "prompt": "fix it", "spec": SPEC, **change}


def test_a_good_message_parses_and_its_identity_is_suite_tag_and_attempt() -> None:
    task = parse_message(_payload())
    assert task.key == "t_a/1"
    assert task.message_id == message_id("s1", "t_a", 1) != message_id("s1", "t_a", 2)
    assert task.message_id == parse_message(_payload()).message_id  # stable across submissions


def test_another_agents_task_is_an_arm_of_its_own_and_codex_keeps_its_keys() -> None:
    """One suite, both agents, the same tag: two rows, two messages, two job roots; codex's as before the seam."""
    claude = parse_message(_payload(spec={**SPEC, "agent": "claude-code"}))
    named_codex = parse_message(_payload(spec={**SPEC, "agent": "codex"}))
    codex = parse_message(_payload())
    assert (codex.arm, codex.key) == (named_codex.arm, named_codex.key) == (None, "t_a/1")
    assert codex.message_id == named_codex.message_id == message_id("s1", "t_a", 1)
    assert (claude.arm, claude.key) == ("claude-code", "t_a/claude-code/1") and claude.message_id != codex.message_id
    row = LedgerRow(tag="t_a", attempt=1, arm="claude-code", state=TaskState.QUEUED, queue="default", submitted_at=0)
    assert row.key == claude.key


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"spec": {**SPEC, "tag": "t;rm -rf /"}}, "spec.tag"),
        ({"suite": "s$(id)"}, "suite"),
        ({"suite": "a..b"}, "suite"),
        ({"prompt": "  \n"}, "prompt"),
        ({"attempt": 0}, "attempt"),
        ({"spec": {**SPEC, "codex_timeout": -1}}, "spec.codex_timeout"),
        ({"spec": {**SPEC, "image": "img $(id)"}}, "spec.image"),
        ({"spec": {**SPEC, "apply_cmd": "two\nlines"}}, "spec.apply_cmd"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_a_malformed_message_names_the_field_and_never_echoes_the_value(change: dict, field: str) -> None:
    with pytest.raises(MessageError) as caught:
        parse_message(_payload(**change))
    text = str(caught.value)
    assert text.startswith("malformed task message: ") and f"{field}:" in text
    for value in change.values():
        for shown in (value.values() if isinstance(value, dict) else [value]):
            if isinstance(shown, str) and shown.strip() and shown not in SPEC.values():
                assert shown not in text


def test_a_key_of_shell_characters_in_a_message_is_not_echoed_either() -> None:
    with pytest.raises(MessageError) as caught:
        parse_message({**_payload(), "$(touch /tmp/x)": 1})
    assert "$(" not in str(caught.value) and "touch" not in str(caught.value)


def _row(tag: str, state: TaskState, resolved: bool | None, infra: bool = False, **extra: object) -> LedgerRow:
    return LedgerRow(tag=tag, attempt=1, state=state, queue="q", resolved=resolved, infra_failure=infra,
                     submitted_at=0.0, **extra)


def test_the_resolved_rate_with_and_without_infrastructure_failures() -> None:
    rows = [
        _row("a", TaskState.DONE, True, input_tokens=10, phase_durations_seconds={"codex": 2.0}),
        _row("b", TaskState.DONE, False, failure_label="failed_codex_codex_timeout"),
        _row("c", TaskState.FAILED, None, infra=True, failure_label="failed_precheck_x", retries=2),
        _row("d", TaskState.RUNNING, None),
        _row("e", TaskState.QUEUED, None),
    ]
    totals = summary(rows)
    assert totals["finished"] == 3 and totals["resolved"] == 1 and totals["infra_failures"] == 1
    assert totals["resolved_rate"] == 0.3333 and totals["resolved_rate_without_infra"] == 0.5
    assert totals["states"] == {"done": 2, "failed": 1, "queued": 1, "running": 1}
    assert totals["failures_by_label"] == {"failed_codex_codex_timeout": 1, "failed_precheck_x": 1}
    assert totals["retries"] == 2 and totals["input_tokens"] == 10 and totals["phase_seconds"] == {"codex": 2.0}
    assert summary([])["resolved_rate"] == 0.0


def test_worker_state_is_what_a_view_reads() -> None:
    state = WorkerState("host-a", 2, ["runner"])
    seen: list[str] = []
    state.add_listener(lambda event, _payload: seen.append(event))
    assert state.accepting() is False, "no host check yet: take nothing"
    state.set_host(HostReport(healthy=True, checks=[Check(name="docker_daemon", ok=True, detail="yes")]))
    assert state.accepting() is True
    state.draining = True
    snapshot = state.snapshot()
    assert snapshot["accepting"] is False and snapshot["draining"] is True
    assert snapshot["slots"] == 2 and snapshot["free"] == 2 and snapshot["busy"] == 0
    assert snapshot["checks"] == [{"name": "docker_daemon", "ok": True, "detail": "yes", "refusal": None}]
    json.dumps(snapshot)  # JSON-ready for an HTTP view
    state.finish_task("s/t/1", _row("t", TaskState.DONE, True))
    assert seen == ["task_finished"] and state.snapshot()["finished"] == {"done": 1}


def _checks(report: HostReport) -> dict[str, Check]:
    return {check.name: check for check in report.checks}


def test_the_worker_checks_codex_and_its_login_as_the_precheck_does(tmp_path: Path, monkeypatch) -> None:
    """One set of checks: a codex that says it is logged in (no auth.json in CODEX_HOME) is taken by
    both; one that is not is refused by both, with the same message naming both ways to log in."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("CODEX_API_KEY", raising=False)
    home = tmp_path / "codex-home"
    home.mkdir()
    logged_in = _checks(check_host(tmp_path, HostSettings(codex_bin=str(FAKE_CODEX), codex_home=home), 0))
    assert logged_in["codex_login"] == codex_login(str(FAKE_CODEX), home) and logged_in["codex_login"].ok
    assert logged_in["codex_binary"].ok and logged_in["git_binary"].ok
    refusing = tmp_path / "codex"
    refusing.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'codex-cli 1.2.3' && exit 0\nexit 1\n")
    refusing.chmod(0o755)
    refused = _checks(check_host(tmp_path, HostSettings(codex_bin=str(refusing), codex_home=home), 0))["codex_login"]
    assert refused == codex_login(str(refusing), home) and not refused.ok
    assert "codex login" in refused.detail and "OPENAI_API_KEY" in refused.detail  # both ways are named
    assert str(tmp_path) not in refused.detail
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-value")
    keyed = _checks(check_host(tmp_path, HostSettings(codex_bin=str(refusing), codex_home=home), 0))["codex_login"]
    assert keyed.ok and "sk-secret-value" not in keyed.detail


@pytest.mark.redis
def test_a_lease_has_one_holder_renewed_only_by_it_and_expires_when_it_dies(redis_namespace) -> None:
    import redis

    from runner.fleet.leases import Lease

    url, namespace = redis_namespace
    client = redis.Redis.from_url(url)
    key = f"{namespace}:lease:s:t/1"
    first, second = Lease(client, key, "host-a", 0.5), Lease(client, key, "host-b", 0.5)
    assert first.acquire() and not second.acquire()
    assert not second.renew() and first.renew()
    second.release()  # not its lease: nothing happens
    assert first.current_holder() == "host-a"
    time.sleep(0.7)  # the holder stopped renewing (it died)
    assert second.acquire() and not first.renew(), "a late renewal never steals the lease back"
    second.release()
    assert client.exists(key) == 0
    # A broker back empty after a restart: the holder still running takes its lease back; nobody else can.
    assert first.acquire()
    client.delete(key)
    assert first.renew() and first.current_holder() == "host-a" and not second.acquire()
    first.release()
    client.close()


@pytest.mark.redis
def test_submitting_a_suite_twice_queues_each_task_once(redis_namespace, tmp_path: Path) -> None:
    import redis

    from runner.fleet.broker import Keys

    url, namespace = redis_namespace
    for tag in ("t_a", "t_b"):
        (tmp_path / tag / "context").mkdir(parents=True)
        (tmp_path / tag / "context" / "prompt.md").write_text("fix it\n")
    args = ["submit", "--broker", url, "--namespace", namespace, "--suite", "s1", "--tag", "t_a", "--tag", "t_b",
            "--attempts", "3", "--prompts-dir", str(tmp_path), "--image", "stub:latest"]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["queued"] == 6
    again = run_cli(*args)
    assert json.loads(again.stdout) | {} == {**json.loads(again.stdout), "queued": 0, "skipped_existing": 6}
    client = redis.Redis.from_url(url)
    keys = Keys(namespace)
    assert client.llen(keys.queue("runner")) == 6, "six messages, not twelve"
    assert client.hlen(keys.ledger("s1")) == 6
    status = run_cli("status", "--broker", url, "--namespace", namespace, "--suite", "s1")
    rows = json.loads(status.stdout)["suites"][0]["rows"]
    assert [(row["tag"], row["attempt"], row["state"]) for row in rows] == [
        (tag, attempt, "queued") for tag in ("t_a", "t_b") for attempt in (1, 2, 3)
    ]
    cancel = run_cli("cancel", "--broker", url, "--namespace", namespace, "--suite", "s1", "--tag", "t_b")
    assert json.loads(cancel.stdout)["dropped_messages"] == 3
    assert client.llen(keys.queue("runner")) == 3
    client.close()


def test_dramatiqs_own_log_lines_name_a_message_by_its_id_never_its_prompt() -> None:
    """Dramatiq logs a failed message as ``run_task({...})``, the prompt included; the worker's filter
    on the root's handlers turns every message argument into its id."""
    import io
    import logging

    from dramatiq import Message
    from dramatiq.broker import MessageProxy

    from runner.fleet.broker import quiet_dramatiq_messages

    sink = io.StringIO()
    handler = logging.StreamHandler(sink)
    logging.root.addHandler(handler)
    try:
        quiet_dramatiq_messages()
        message = Message(queue_name="runner", actor_name="run_task", kwargs={}, options={},
                          args=({**_payload(), "prompt": "SECRET-PROMPT-TEXT fix it"},), message_id="m-123")
        logger = logging.getLogger("dramatiq.worker.WorkerThread")
        logger.error("Failed to process message %s with unhandled exception.", MessageProxy(message))
        logger.warning("Message %s was skipped.", message)
        logger.warning("Retrying message %r in %d milliseconds.", message.message_id, 15)
    finally:
        logging.root.removeHandler(handler)
    text = sink.getvalue()
    assert "SECRET-PROMPT-TEXT" not in text and "fix it" not in text
    assert text.count("message m-123") == 2 and "'m-123' in 15 milliseconds" in text


def test_a_workers_agent_checks_are_the_seams_remembered_a_while_and_codex_is_the_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Claude Code installed after the first check is found only once the remembered answer expires."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    claude = tmp_path / "claude"
    clock = [100.0]
    checks = AgentChecks(HostSettings(claude_bin=str(claude)), ttl=60, clock=lambda: clock[0])
    assert checks.checks(AgentName.CODEX) == []  # check_host's, every --check-interval
    first = {check.name: check.ok for check in checks.checks(AgentName.CLAUDE_CODE)}
    assert set(first) == {"claude_code_binary", "claude_code_login"} and first["claude_code_binary"] is False  # git: the host's
    claude.write_text("#!/bin/sh\necho '2.1.197 (Claude Code)'\n")
    claude.chmod(0o755)
    clock[0] += 59
    assert not checks.checks(AgentName.CLAUDE_CODE)[0].ok  # remembered
    clock[0] += 2
    found = checks.checks(AgentName.CLAUDE_CODE)[0]
    assert found.ok and "claude-code 2.1.197" in found.detail
    state = WorkerState("w", 1, ["default"])
    state.agent_checks = checks.reported()
    assert [check.name for check in state.checks()] == ["claude_code_binary", "claude_code_login"]
