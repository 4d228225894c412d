"""The fleet's parts without Docker: messages, the ledger's arithmetic, leases and submit on a real Redis."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from runner.fleet.ledger import LedgerRow, TaskState, summary
from runner.fleet.messages import MessageError, TaskMessage, TaskOptions, message_id, parse_message
from runner.fleet.worker import WorkerState
from runner.phases.precheck import Check
from runner.fleet.hostchecks import HostReport, codex_login_check
from tests.conftest import run_cli

OPTIONS = {"codex_timeout": 10, "eval_timeout": 10, "eval_network": "bridge", "source_dir": "/app",
           "apply_cmd": "true", "test_cmd": "true"}


def _payload(**change: object) -> dict:
    return {"suite": "s1", "tag": "t_a", "attempt": 1, "prompt": "fix it", "options": OPTIONS, **change}


def test_a_good_message_parses_and_its_identity_is_suite_tag_and_attempt() -> None:
    task = parse_message(_payload())
    assert task.key == "t_a/1"
    assert task.message_id == message_id("s1", "t_a", 1) != message_id("s1", "t_a", 2)
    assert task.message_id == parse_message(_payload()).message_id  # stable across submissions


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tag": "t;rm -rf /"}, "tag"),
        ({"suite": "s$(id)"}, "suite"),
        ({"suite": "a..b"}, "suite"),
        ({"prompt": "  \n"}, "prompt"),
        ({"attempt": 0}, "attempt"),
        ({"options": {**OPTIONS, "codex_timeout": -1}}, "options.codex_timeout"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_a_malformed_message_names_the_field_and_never_echoes_the_value(change: dict, field: str) -> None:
    with pytest.raises(MessageError) as caught:
        parse_message(_payload(**change))
    text = str(caught.value)
    assert text.startswith("malformed task message: ") and f"{field}:" in text
    for value in change.values():
        if isinstance(value, str) and value.strip():
            assert value not in text


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


def test_the_codex_login_check_looks_for_a_stored_login_or_a_key_and_names_neither(tmp_path: Path) -> None:
    assert codex_login_check({"CODEX_HOME": str(tmp_path)}).ok is False
    assert codex_login_check({"CODEX_HOME": str(tmp_path), "OPENAI_API_KEY": "sk-secret"}).ok is True
    (tmp_path / "auth.json").write_text("{}")
    check = codex_login_check({"CODEX_HOME": str(tmp_path)})
    assert check.ok is True and str(tmp_path) not in check.detail


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


def test_task_options_carry_every_task_setting() -> None:
    from runner.settings import load_settings

    options = TaskOptions.from_settings(load_settings(), None)
    task = TaskMessage(suite="s", tag="t", attempt=2, prompt="p", options=options)
    assert set(task.settings_overrides()) == {"tag", "image", "allow_pull", "codex_timeout", "eval_timeout",
                                              "eval_network", "source_dir", "apply_cmd", "test_cmd"}
