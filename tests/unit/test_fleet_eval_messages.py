"""Evaluation units' messages without Docker: the round-trip through a real submit and Dramatiq's
encoding, the patch's bytes checked on the worker's side, and bad input refused before anything is queued."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
import redis
from dramatiq import Message

from reducers.outcome import TaskState
from runner.fleet.broker import Keys, task_message
from runner.fleet.ledger import LedgerRow
from runner.fleet.outcome import Action, decide_evaluation
from runner.fleet.rejects import rejected_row
from runner.tasks.protocol import EvalMessage, MessageError, parse_any_message
from tests.conftest import REPO, run_cli

GOLDEN = (REPO / "containers" / "stub" / "golden.patch").read_bytes()
SPEC = {"tag": "t_a", "eval_timeout": 10, "eval_network": "none"}


def _payload(data: bytes = GOLDEN, **unit: object) -> dict:
    return {"kind": "eval", "suite": "s1", "spec": SPEC, "data": base64.b64encode(data).decode(),
            "unit": {"name": "golden.patch", "sha256": hashlib.sha256(GOLDEN).hexdigest(), "size": len(GOLDEN),
                     **unit}}


def test_an_evaluation_message_round_trips_through_dramatiq_with_its_bytes_intact() -> None:
    message = parse_any_message(_payload())
    assert isinstance(message, EvalMessage) and message.key == "t_a/golden.patch"
    encoded = task_message(message, "runner").encode()
    again = parse_any_message(Message.decode(encoded).args[0])
    assert again == message and again.patch_bytes() == GOLDEN
    assert again.message_id == message.message_id
    other = parse_any_message(_payload(GOLDEN + b"\n", sha256=hashlib.sha256(GOLDEN + b"\n").hexdigest(),
                                       size=len(GOLDEN) + 1))
    assert other.key == message.key and other.message_id != message.message_id  # new bytes: a new unit


@pytest.mark.parametrize(
    ("payload", "said"),
    [
        (_payload(GOLDEN.replace(b"a + b", b"a * b")), "do not match its sha256"),
        (_payload(size=len(GOLDEN) + 1), "do not match its sha256"),
        ({**_payload(), "data": "not base64 !"}, "data: the patch is not base64"),
        (_payload(name="../../etc/passwd"), "unit.name: not a safe patch name"),
        (_payload(sha256="abc"), "unit.sha256: not a sha256 in hex"),
        (_payload(rejection="empty_patch"), "a rejected patch carries no bytes"),
        (_payload(rejection="rm -rf"), "unit.rejection"),
    ],
)
def test_a_bad_evaluation_message_is_refused_naming_the_problem_never_the_value(payload: dict, said: str) -> None:
    with pytest.raises(MessageError) as caught:
        parse_any_message(payload)
    assert said in str(caught.value)
    assert "passwd" not in str(caught.value) and "rm -rf" not in str(caught.value)


def test_a_refused_evaluation_message_fails_its_own_units_row() -> None:
    payload = _payload(GOLDEN + b"x")
    with pytest.raises(MessageError) as caught:
        parse_any_message(payload)
    suite, row = rejected_row(payload, caught.value, queue="runner", host="h", message_id="0" * 32)
    assert suite == "s1" and row.kind == "eval" and row.key == "t_a/golden.patch"
    assert row.state is TaskState.FAILED and row.failure_label == "bad_message"


def _scored(state: str, **fields: object) -> dict:
    return {"tag": "t_a", "patch": "p.patch", "patch_sha256": "0" * 64, "patch_bytes": 1, "state": state,
            "image": "i", "network": "none", **fields}


def test_an_evaluation_rows_state_becomes_the_units_outcome_by_the_fleets_rule() -> None:
    scored = decide_evaluation(_scored("scored", resolved=True, exit_code_verdict=True), 0, 1.0,
                               stop_reason=None, retries=0, max_retries=2)
    assert scored.action is Action.DONE and scored.facts.state is TaskState.DONE and scored.facts.resolved is True
    rejected = decide_evaluation(_scored("rejected", label="empty_patch", resolved=False), 0, 0.1,
                                 stop_reason=None, retries=0, max_retries=2)
    assert rejected.facts.state is TaskState.DONE and rejected.facts.resolved is False
    assert rejected.facts.failure_label == "empty_patch" and not rejected.facts.infra_failure
    infra = decide_evaluation(_scored("infra_failed", label="image_missing"), 3, 0.1, stop_reason=None, retries=0,
                              max_retries=2)
    assert infra.action is Action.RETRY and infra.facts.infra_failure and infra.facts.resolved is None
    exhausted = decide_evaluation(_scored("infra_failed", label="image_missing"), 3, 0.1, stop_reason=None,
                                  retries=2, max_retries=2)
    assert exhausted.action is Action.DONE and exhausted.facts.state is TaskState.FAILED
    unscorable = decide_evaluation(_scored("unscorable", label="profile: x"), 0, 0.1, stop_reason=None, retries=0,
                                   max_retries=2)
    assert unscorable.facts.state is TaskState.FAILED and not unscorable.facts.scored


def test_an_eval_row_and_a_task_row_of_one_tag_have_keys_of_their_own() -> None:
    task = LedgerRow(tag="t_a", attempt=1, state=TaskState.QUEUED, queue="q", submitted_at=0)
    unit = LedgerRow(kind="eval", tag="t_a", attempt=1, patch="p.patch", state=TaskState.QUEUED, queue="q",
                     submitted_at=0)
    assert task.key == "t_a/1" and unit.key == "t_a/p.patch"
    assert LedgerRow.model_validate_json(unit.model_dump_json()) == unit


def test_submitting_a_patches_dir_queues_each_patch_once_and_refuses_bad_input(
    redis_namespace, tmp_path: Path
) -> None:
    url, namespace = redis_namespace
    patches = tmp_path / "Patches"
    (patches / "t_a").mkdir(parents=True)
    (patches / "t_a" / "golden.patch").write_bytes(GOLDEN)
    (patches / "t_a" / "empty.patch").write_bytes(b"")
    (patches / "t_a" / "notes.txt").write_text("not a patch: not a unit")
    base = ("submit", "--broker", url, "--namespace", namespace, "--suite", "s1", "--patches-dir", str(patches))
    first = run_cli(*base)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["queued"] == 2 and json.loads(first.stdout)["rejected"] == ["t_a/empty.patch"]
    client = redis.Redis.from_url(url)
    keys = Keys(namespace)
    queued = [parse_any_message(Message.decode(raw).args[0]) for raw in client.hgetall(f"{keys.queue('runner')}.msgs").values()]
    assert {m.key: m.patch_bytes() for m in queued} == {"t_a/golden.patch": GOLDEN, "t_a/empty.patch": b""}
    again = run_cli(*base)
    assert json.loads(again.stdout)["queued"] == 0 and json.loads(again.stdout)["skipped_existing"] == 2
    assert client.hlen(f"{keys.queue('runner')}.msgs") == 2
    with_attempts = run_cli(*base, "--attempts", "2")
    assert with_attempts.returncode == 2 and "--attempts goes with --prompts-dir" in with_attempts.stderr
    both = run_cli(*base, "--prompts-dir", str(tmp_path))
    assert both.returncode == 2
    (patches / "t_a" / "huge.patch").write_bytes(b"--- a/x\n+++ b/x\n" + b"+" * (9 * 1024 * 1024))
    huge = run_cli(*base)
    assert huge.returncode == 2 and "larger than the queue carries" in huge.stderr
    assert client.hlen(f"{keys.queue('runner')}.msgs") == 2, "a refused submit queues nothing"
    client.close()
