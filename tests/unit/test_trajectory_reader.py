"""The tolerant reader, the trajectory and the ATIF mapping, on streams the real codex wrote.

``tests/fixtures/codex_streams/`` holds what codex-cli 0.171.0 wrote in three scripted-model
runs through the pipeline (``<name>.exec.jsonl``: its ``exec --json`` stdout;
``<name>.session.jsonl``: its session record), with the job root's path replaced by
``/job-root``: ``resolved`` (a message and a ``cat``, the fix, the check, a command exiting 3,
a closing message), ``wrong_fix`` (a wrong fix, then pytest exiting 4) and ``model_error``
(one command, then the provider answering 500: ``turn.failed`` and no usage on the stream).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.codex_usage import TokenCounts
from runner.pricing import parse_rate_card
from runner.errors import InvalidTrajectoryError
from runner.trajectory.atif import to_atif, tokens_of, validate_atif
from runner.trajectory.attempt import AttemptView
from runner.trajectory.events import COMMAND, FILE_CHANGE, read_exec_stream
from runner.trajectory.model import build_trajectory, display_command, runs_tests
from runner.trajectory.session import read_session_record
from runner.trajectory.timeline import timeline

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "codex_streams"
CHECK = "python3 -c 'from calc import mathops; assert mathops.add(2, 3) == 5' && echo CHECK-PASSED"
CARD = parse_rate_card(b'version = "t"\n[models."runner-scripted-model"]\ninput_per_million = 1.0\n'
                       b"cached_input_per_million = 0.1\noutput_per_million = 10.0\nreasoning_per_million = 20.0\n", "t")
PER_RESPONSE = TokenCounts(100, 40, 0, 20, 5)


def _job(tmp_path: Path, name: str, *, session: bool = True, exec_text: str | None = None) -> Path:
    root = tmp_path / name
    (root / "logs").mkdir(parents=True)
    (root / "logs" / "codex.stdout.log").write_text(exec_text if exec_text is not None
                                                     else (FIXTURES / f"{name}.exec.jsonl").read_text())
    if session:
        sessions = root / "agent-home" / "codex-home" / "sessions" / "2026" / "12" / "07"
        sessions.mkdir(parents=True)
        (sessions / "rollout-2026-12-07T09-23-18-x.jsonl").write_text((FIXTURES / f"{name}.session.jsonl").read_text())
    return root


def _trajectory(root: Path, card=CARD):
    stream = read_exec_stream(root / "logs" / "codex.stdout.log", root=root)
    record = read_session_record(root / "agent-home" / "codex-home", root=root)
    return build_trajectory(stream, record, model="runner-scripted-model", card=card)


def _shape(trajectory) -> list[tuple[list[str], list[tuple[str, int | None]], list[str]]]:
    return [(step.messages, [(display_command(c.command), c.exit_code) for c in step.commands],
             [Path(ch.path).name for f in step.file_changes for ch in f.changes]) for step in trajectory.steps]


RESOLVED = [
    (["Reading the code first."], [("cat calc/mathops.py", 0)], []),
    ([], [], ["mathops.py"]),
    ([], [(CHECK, 0)], []),
    ([], [("echo checking again; exit 3", 3)], []),
    (["Fixed."], [], []),
]


def test_the_real_stream_and_session_record_give_one_step_per_model_response(tmp_path: Path) -> None:
    trajectory = _trajectory(_job(tmp_path, "resolved"))
    assert _shape(trajectory) == RESOLVED
    assert trajectory.from_session_record and trajectory.usage_reported
    assert [step.usage for step in trajectory.steps] == [PER_RESPONSE] * 5
    assert trajectory.usage == TokenCounts(500, 200, 0, 100, 25)
    assert [step.cost_usd for step in trajectory.steps] == [0.000314] * 5 and trajectory.cost_usd == 0.00157
    assert all(c.duration_seconds is not None for c in trajectory.commands)  # from the record: the stream has none
    assert [item.text for item in trajectory.preamble][0].startswith("Model metadata for `runner-scripted-model`")
    assert trajectory.raw_events == ()
    assert trajectory.thread_id == "01a24fd0-9188-7b22-a871-5d86d210f7ed"


def test_without_the_session_record_the_stream_alone_gives_the_same_steps(tmp_path: Path) -> None:
    trajectory = _trajectory(_job(tmp_path, "resolved", session=False))
    assert _shape(trajectory) == RESOLVED
    assert not trajectory.from_session_record and all(step.usage is None for step in trajectory.steps)
    assert trajectory.usage == TokenCounts(500, 200, 0, 100, 25)  # codex's own total


def test_a_failed_turn_is_counted_from_the_session_record(tmp_path: Path) -> None:
    trajectory = _trajectory(_job(tmp_path, "model_error"))
    assert _shape(trajectory) == [([], [("echo first turn", 0)], [])]
    assert trajectory.failed_turns == 1 and not trajectory.usage_reported
    assert trajectory.usage == PER_RESPONSE  # the one response the model completed
    assert trajectory.errors == ("We’re currently experiencing high demand, which may cause temporary errors.",)
    document = to_atif(AttemptView(root=tmp_path, tag="t", prompt="p", trajectory=trajectory), codex_version=None)
    assert document["extra"]["codex_errors"] == list(trajectory.errors)
    lines = [line.text for line in timeline(AttemptView(root=tmp_path, tag="t", prompt="p", trajectory=trajectory))]
    assert "codex: 1 turn(s) failed" in lines


def test_tests_the_agent_ran_are_named_and_a_failing_one_shows_its_output(tmp_path: Path) -> None:
    root = _job(tmp_path, "wrong_fix")
    trajectory = _trajectory(root)
    assert _shape(trajectory) == [([], [], ["mathops.py"]), ([], [("python3 -m pytest -q tests", 4)], []),
                                  (["done"], [], [])]
    assert runs_tests(display_command(trajectory.commands[0].command))
    lines = [line.text for line in timeline(AttemptView(root=root, tag="stub_calc", prompt="p", trajectory=trajectory))]
    assert "  $ python3 -m pytest -q tests [test]  -> exit 4 " in "\n".join(lines)
    assert "      no tests ran in 0.57s" in lines
    assert "total: 3 steps, 1 commands (1 failed, 1 test runs), 1 files changed" in lines


def test_what_the_reader_does_not_know_is_kept_raw_where_it_came(tmp_path: Path) -> None:
    lines = (FIXTURES / "resolved.exec.jsonl").read_text().splitlines()
    changed = [
        *lines[:3],
        json.dumps({"type": "session.configured", "sandbox": "workspace-write"}),  # an event of a later version
        *lines[3:5],
        json.dumps({"type": "item.completed", "item": {"id": "todo_9", "type": "todo_list", "items": [{"text": "x"}]}}),
        "this line is not JSON",
        *lines[5:],
    ]
    root = _job(tmp_path, "resolved", exec_text="\n".join(changed) + "\n")
    trajectory = _trajectory(root)
    assert _shape(trajectory) == RESOLVED  # nothing known is lost or moved
    assert [(step, e.why) for step, e in trajectory.raw_events] == [(0, "unknown_event"), (1, "not_json")]
    assert [item.kind for item in trajectory.steps[0].items][-1] == "todo_list"
    document = to_atif(AttemptView(root=root, tag="stub_calc", prompt="Fix it.\n", trajectory=trajectory),
                       codex_version="codex-cli 0.171.0")
    validate_atif(document)
    assert document["extra"]["codex_raw"][-1]["event"] == {"type": "session.configured", "sandbox": "workspace-write"}
    kept = document["steps"][1]["extra"]["codex_raw"]
    assert kept[0]["item"]["type"] == "todo_list" and kept[1] == {"line": 8, "why": "not_json",
                                                                  "event": "this line is not JSON"}
    assert tokens_of(document) == TokenCounts(500, 200, 0, 100, 25)


def test_a_stream_still_being_written_shows_the_running_command(tmp_path: Path) -> None:
    lines = (FIXTURES / "resolved.exec.jsonl").read_text().splitlines()
    started = next(i for i, line in enumerate(lines) if '"item.started"' in line and "command_execution" in line)
    text = "\n".join(lines[:started + 1]) + "\n" + lines[started + 1][:40]  # a torn last line
    root = _job(tmp_path, "resolved", exec_text=text)
    stream = read_exec_stream(root / "logs" / "codex.stdout.log", root=root)
    assert stream.torn_tail and not stream.raw_events
    running = stream.items[-1]
    assert running.kind == COMMAND and not running.completed and running.exit_code is None
    trajectory = _trajectory(root)
    assert "  $ cat calc/mathops.py  -> running" in [line.text for line in timeline(
        AttemptView(root=root, tag="t", prompt=None, trajectory=trajectory, running=True))]


LEGACY = "\n".join(json.dumps(event) for event in [
    {"id": "0", "msg": {"type": "task_started"}},
    {"id": "1", "msg": {"type": "agent_message", "message": "Looking."}},
    {"id": "2", "msg": {"type": "exec_command_begin", "call_id": "c1", "command": ["bash", "-lc", "ls"]}},
    {"id": "2", "msg": {"type": "exec_command_end", "call_id": "c1", "exit_code": 2, "stdout": "no",
                        "duration": {"secs": 1, "nanos": 500000000}}},
    {"id": "3", "msg": {"type": "patch_apply_begin", "call_id": "p1", "changes": {"a.py": {"update": {}}}}},
    {"id": "3", "msg": {"type": "patch_apply_end", "call_id": "p1", "success": True}},
    {"id": "4", "msg": {"type": "token_count", "input_tokens": 10, "cached_input_tokens": 2, "output_tokens": 3}},
    {"id": "5", "msg": {"type": "mystery"}},
    {"id": "6", "msg": {"type": "task_complete"}},
]) + "\n"


def test_the_older_envelope_is_read_too(tmp_path: Path) -> None:
    root = _job(tmp_path, "legacy", session=False, exec_text=LEGACY)
    trajectory = _trajectory(root)
    assert _shape(trajectory) == [(["Looking."], [("ls", 2)], []), ([], [], ["a.py"])]
    assert trajectory.commands[0].duration_seconds == 1.5 and trajectory.commands[0].output == "no"
    assert trajectory.usage == TokenCounts(10, 2, 0, 3, 0) and trajectory.codex_turns == 1
    assert [e.why for _, e in trajectory.raw_events] == ["unknown_event"]
    assert trajectory.steps[1].file_changes[0].kind == FILE_CHANGE


def test_the_atif_validator_holds_the_rfc_rules(tmp_path: Path) -> None:
    root = _job(tmp_path, "resolved")
    document = to_atif(AttemptView(root=root, tag="stub_calc", prompt="Fix it.\n", trajectory=_trajectory(root)),
                       codex_version="codex-cli 0.171.0")
    parsed = validate_atif(document)
    assert parsed.agent.version == "0.171.0" and parsed.final_metrics.total_steps == 6
    assert parsed.final_metrics.total_cost_usd == 0.00157
    for change, problem in [
        (lambda d: d["steps"][0].update(metrics={"prompt_tokens": 1}), "only apply to agent steps"),
        (lambda d: d["steps"][1].update(timestamp="yesterday"), "timestamp"),
        (lambda d: d["steps"][1].update(colour="red"), "colour"),
        (lambda d: d.pop("session_id"), "session_id"),
        (lambda d: d.update(schema_version="ATIF-v9"), "schema_version"),
        (lambda d: d["steps"][1]["metrics"].update(prompt_tokens=-1), "prompt_tokens"),
    ]:
        broken = json.loads(json.dumps(document))
        change(broken)
        with pytest.raises(InvalidTrajectoryError, match=problem):
            validate_atif(broken)


def test_a_running_attempt_is_known_by_its_lock_holder_which_must_be_a_runner(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    from runner.lock import LOCK_NAME
    from runner.trajectory.attempt import lock_holder_alive

    assert not lock_holder_alive(tmp_path)  # no lock file: nothing ever ran here
    runner_like = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "-m", "runner"])
    other = subprocess.Popen(["sleep", "30"])
    try:
        for process in (runner_like, other):  # until each has exec'd (a forked child still shows pytest's argv)
            for _ in range(500):
                if Path(f"/proc/{process.pid}/exe").resolve().name != Path(sys.executable).resolve().name \
                        or b"runner" in Path(f"/proc/{process.pid}/cmdline").read_bytes():
                    break
                time.sleep(0.01)
        (tmp_path / LOCK_NAME).write_text(f"{runner_like.pid}\n")
        assert lock_holder_alive(tmp_path)
        (tmp_path / LOCK_NAME).write_text(f"{other.pid}\n")  # a pid reused by another program
        assert not lock_holder_alive(tmp_path)
    finally:
        for process in (runner_like, other):
            process.kill()
            process.wait()
    (tmp_path / LOCK_NAME).write_text(f"{runner_like.pid}\n")  # the runner has ended
    assert not lock_holder_alive(tmp_path)


def test_no_public_view_imports_the_private_ones() -> None:
    """The status page, worker --http, /metrics, the public report and the public writer know nothing
    of the private views, so none can serve, link or embed them."""
    import ast

    runner = Path(__file__).resolve().parents[2] / "runner"
    public = [runner / "public.py", runner / "fleet" / "views.py", runner / "fleet" / "worker.py",
              *(p for p in (runner / "views").glob("*.py") if p.name != "private_report.py")]
    for path in public:
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        private = sorted(m for m in imported if m.startswith(("runner.trajectory", "runner.show_command"))
                         or m == "runner.views.private_report")
        assert not private, f"{path.name} imports {private}"
