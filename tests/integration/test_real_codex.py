"""The real Codex CLI in the loop, against the scripted model, on the stub image.

Every case runs ``python -m runner --execute`` as an operator would, with the real
``codex`` and a local model server (runner/canary/model_server.py) whose script is
the test's data. Skips without the real CLI, except under CI=true (fails there).
The sandbox cases are honest about this host: codex 0.171.0 sandboxes the agent's
commands with bubblewrap here (writes outside the workspace fail with "Read-only
file system"); ``test_without_the_guards_the_agent_reaches_tmp_and_the_key`` shows
that the guard tests can fail.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runner.canary.model_server import (
    KEY_VARIABLE,
    MODEL,
    ScriptedModel,
    exec_call,
    fault,
    message,
    turn,
    write_codex_home,
)
from runner.canary.run import RUN_THE_CHECK, fix_call
from tests.conftest import IN_CI, CompactRun, log_events, make_job_root, read_json, run_cli, stub_args

SHIPPED_CARD = Path(__file__).resolve().parents[2] / "runner" / "data" / "rate_card.toml"
# Dollars per million tokens of the scripted model, for the tests' own --rate-card.
SCRIPTED_CARD = f"""version = "test-1"
[models."{MODEL}"]
input_per_million = 1.0
cached_input_per_million = 0.1
output_per_million = 10.0
reasoning_per_million = 20.0
"""
# TURN_USAGE on that card: (100-40)*1 + 40*0.1 + (20-5)*10 + 5*20 = 314 millionths of a dollar a response
COST_PER_RESPONSE = 0.000314

pytestmark = [pytest.mark.docker, pytest.mark.real_codex, pytest.mark.usefixtures("no_leaked_containers")]

KEY_VALUE = "sk-scripted-" + secrets.token_hex(12)
OPENAI_VALUE = "sk-openai-" + secrets.token_hex(12)
PLANTED = "planted-secret-" + secrets.token_hex(12)


@pytest.fixture(scope="module")
def real_codex() -> Path:
    found = os.environ.get("CODEX_CONTRACT_BIN") or shutil.which("codex")
    if found is None:
        if IN_CI:
            pytest.fail("CI=true and the real Codex CLI is not installed (npm install -g @openai/codex)")
        pytest.skip("the real Codex CLI is not installed (npm install -g @openai/codex)")
    return Path(found)


@dataclass
class Run(CompactRun):
    requests: int = 0
    completed: int = 0  # responses the model sent whole, usage and all

    def codex_events(self) -> str:
        return (self.job / "logs" / "codex.stdout.log").read_text(errors="replace")


@pytest.fixture
def run_scripted(tmp_path: Path, stub_image: str, real_codex: Path) -> Iterator:
    def run(script, *extra: str, idle_timeout_ms: int = 3000, env: dict[str, str] | None = None) -> Run:
        job = make_job_root(tmp_path, "Fix calc.mathops.add so that it returns the sum.\n")
        if callable(script):  # a script that needs the job root's path
            script = script(job)
        with ScriptedModel(script) as model:
            home = write_codex_home(tmp_path / "codex-home", model.base_url, idle_timeout_ms=idle_timeout_ms)
            done = run_cli(
                "--execute", *stub_args(job, stub_image, codex=real_codex), f"--codex-home={home}",
                "--codex-timeout=120", *extra,
                env={KEY_VARIABLE: KEY_VALUE, "OPENAI_API_KEY": OPENAI_VALUE, "DEPLOY_SECRET_TOKEN": PLANTED,
                     **(env or {})},
            )
            requests, completed = model.requests, model.completed
        return Run(done.returncode, job, done.stderr, requests, completed)

    yield run


def test_a_fix_then_the_tests_run_the_ordinary_way_is_resolved(run_scripted) -> None:
    artefacts = (
        "mkdir -p node_modules/left-pad && echo 'module.exports = 1' > node_modules/left-pad/index.js && "
        "echo 'coverage data' > .coverage && mkdir -p build_helper.egg-info && echo x > build_helper.egg-info/PKG-INFO"
    )
    done = run_scripted(
        [turn(fix_call()), turn(exec_call(RUN_THE_CHECK)), turn(exec_call(artefacts)), turn(message("fixed"))]
    )
    assert done.exit_code == 0, done.stderr[-2000:]
    assert done.result["terminal_state"] == "resolved"
    run = done.run
    assert run["changed_file_count"] == 1 and run["binary_change_count"] == 0 and run["sensitive_file_count"] == 0
    assert run["artifact_files_left_out"] == 3  # index.js, .coverage, PKG-INFO (the bytecode is .gitignored)
    patch = (done.job / "Patches" / "stub_calc" / "attempt.patch").read_text()
    assert "node_modules" not in patch and ".coverage" not in patch and "egg-info" not in patch
    assert "CHECK-PASSED" in done.codex_events()  # the agent ran the check, bytecode and all
    assert list((done.job / "buggy-source" / "calc" / "__pycache__").glob("*.pyc"))
    assert run["infra_failure"] is False and done.result["infra_failure"] is False
    assert run["codex"]["model"] == MODEL and run["codex"]["last_message_present"] is True
    assert run["codex"]["version"].startswith("codex-cli ")
    assert len(run["codex"]["overrides_sha256"]) == 64
    # four requests, four turns' usage as the model sent it, summed (one codex turn)
    assert done.requests == 4
    assert run["metrics"]["input_tokens"] == 400 and run["metrics"]["cache_tokens"] == 160
    assert run["metrics"]["output_tokens"] == 80 and run["metrics"]["reasoning_tokens"] == 20
    # the scripted model is on no card: its cost is unknown, not a made-up 0, and nothing stopped codex
    assert run["metrics"]["cost_known"] is False and run["metrics"]["cost_usd"] is None
    assert run["metrics"]["rate_card_sha256"] == hashlib.sha256(SHIPPED_CARD.read_bytes()).hexdigest()
    assert run["codex"]["budget_exceeded"] is False and run["codex"]["budget_reason"] is None
    assert log_events(done.stderr, "model_not_on_rate_card")[0]["model"] == MODEL


WRONG_FIX = exec_call(
    "apply_patch <<'PATCH'\n*** Begin Patch\n*** Update File: calc/mathops.py\n@@\n"
    "-    return a - b\n+    return a * b\n*** End Patch\nPATCH"
)


def test_a_wrong_fix_is_unresolved(run_scripted) -> None:
    done = run_scripted([turn(WRONG_FIX), turn(message("done"))])
    assert done.exit_code == 0, done.stderr[-2000:]
    assert done.result["terminal_state"] == "evaluated_unresolved"
    assert done.run["apply_exit_code"] == 0 and done.run["patched_exit_code"] != 0
    assert done.run["infra_failure"] is False


@pytest.mark.parametrize(
    ("kind", "error_class"),
    [("http_500", "provider_error"), ("malformed", "stream_disconnected"), ("cut", "stream_disconnected"),
     ("hang", "stream_idle_timeout")],
)
def test_a_failing_model_is_an_infrastructure_failure(run_scripted, kind: str, error_class: str) -> None:
    done = run_scripted([turn(exec_call("echo first turn")), fault(kind)], idle_timeout_ms=1500)
    assert done.exit_code == 1
    run = done.run
    assert run["first_failed_phase"] == "codex" and run["first_failure_reason"] == "codex_model_error"
    assert run["codex"]["model_error"] == error_class
    assert run["infra_failure"] is True and done.result["infra_failure"] is True
    assert run["codex"]["last_message_present"] is False  # codex wrote an empty file
    assert (done.job / "codex-last-message.txt").exists()
    assert run["codex"]["failed_turns"] == 1
    assert "infrastructure failure" in done.stderr


def test_a_model_that_hangs_past_the_deadline_is_a_codex_timeout(run_scripted) -> None:
    done = run_scripted([fault("hang")], "--codex-timeout=4", idle_timeout_ms=600_000)
    assert done.exit_code == 1
    assert done.run["first_failure_reason"] == "codex_timeout"
    assert done.run["infra_failure"] is False and done.run["codex"]["timed_out"] is True


@pytest.mark.parametrize("cap", ["--max-tokens=300", f"--max-cost-usd={COST_PER_RESPONSE * 2.5}"])
def test_a_cap_stops_codex_after_the_response_that_crosses_it_and_the_attempt_is_scored(
    run_scripted, tmp_path: Path, cap: str
) -> None:
    """Each response spends 120 tokens (314 µ$): two stay under the cap, the third crosses it.

    codex writes a response's usage to its session record once that turn's command has run, as it
    sends the next request, so the meter sees the third one then and stops codex at the latest
    while the (slow) fourth is being answered."""
    card = tmp_path / "card.toml"
    card.write_text(SCRIPTED_CARD)
    script = [turn(WRONG_FIX), turn(exec_call("echo turn-2")), turn(exec_call("echo turn-3")),
              *[turn(exec_call(f"echo turn-{i}"), thinking_seconds=30) for i in range(4, 7)]]
    done = run_scripted(script, cap, f"--rate-card={card}")
    assert done.exit_code == 0, done.stderr[-2000:]  # scored: patched and evaluated, not an infrastructure failure
    # the fourth, if codex had sent it by then, was cut off before its answer
    assert done.completed == 3 and done.requests in (3, 4)
    run = done.run
    assert run["codex"]["budget_exceeded"] is True
    assert run["codex"]["budget_reason"] == cap.split("=")[0].removeprefix("--").replace("-", "_")
    assert run["infra_failure"] is False and run["codex"]["timed_out"] is False
    assert done.result["terminal_state"] == "evaluated_unresolved"  # the tree as the agent left it
    assert run["phase_status"]["patch"] == "ok" and run["phase_status"]["evaluate"] == "ok"
    # the tokens of the three responses, as the script spent them, and their price on the card
    assert run["metrics"]["input_tokens"] == 300 and run["metrics"]["cache_tokens"] == 120
    assert run["metrics"]["output_tokens"] == 60 and run["metrics"]["reasoning_tokens"] == 15
    assert run["metrics"]["cost_known"] is True and run["metrics"]["cost_usd"] == pytest.approx(3 * COST_PER_RESPONSE)
    assert run["metrics"]["rate_card_sha256"] == hashlib.sha256(card.read_bytes()).hexdigest()
    marker = read_json(done.job / "result-markers" / "codex.json")
    assert marker["status"] == "ok" and marker["details"]["budget_exceeded"] is True
    assert "turn-3" in done.codex_events() and "turn-4" not in done.codex_events()
    live = read_json(done.job / "logs" / "codex.usage.json")  # what a batch's suite budget reads meanwhile
    assert live["total_tokens"] == 360 and live["cost_usd"] == pytest.approx(3 * COST_PER_RESPONSE)


def test_a_codex_killed_at_its_deadline_still_has_its_tokens_counted(run_scripted, tmp_path: Path) -> None:
    """codex reports usage only when it ends; the meter has the responses that completed before the kill."""
    card = tmp_path / "card.toml"
    card.write_text(SCRIPTED_CARD)
    done = run_scripted([turn(exec_call("echo a")), turn(exec_call("echo b")), fault("hang")],
                        "--codex-timeout=8", f"--rate-card={card}", idle_timeout_ms=600_000)
    assert done.exit_code == 1 and done.run["first_failure_reason"] == "codex_timeout"
    assert done.run["metrics"]["input_tokens"] == 200 and done.run["metrics"]["output_tokens"] == 40
    assert done.run["metrics"]["cost_usd"] == pytest.approx(2 * COST_PER_RESPONSE)
    assert done.run["codex"]["budget_exceeded"] is False


def test_a_rate_card_that_is_not_one_is_refused_before_any_work(run_scripted, tmp_path: Path) -> None:
    card = tmp_path / "card.toml"
    card.write_text('version = "x"\n[models."m"]\ninput_per_million = -1\n')
    done = run_scripted([turn(message("never asked"))], f"--rate-card={card}")
    assert done.exit_code == 2 and done.requests == 0
    assert "card.toml" in done.stderr and "input_per_million" in done.stderr
    assert read_json(done.job / "result-markers" / "precheck.json")["status"] == "failed"
    assert not (done.job / "buggy-source").exists()  # refused at the precheck: nothing extracted


def test_the_agent_cannot_write_the_job_root_through_tmp_and_the_attempt_stands(run_scripted, tmp_path: Path) -> None:
    probe = Path("/tmp") / f"runner-test-probe-{secrets.token_hex(6)}"
    tmpdir = tmp_path / "operator-tmpdir"  # a $TMPDIR of its own, outside the job root
    tmpdir.mkdir()

    def script(job: Path) -> list:
        attack = (
            f"echo forged > {job}/result-markers/extract.json; echo forged > {job}/logs/evil.txt; "
            f'echo forged > {probe}; echo forged > "$TMPDIR/probe"; echo forged > {tmpdir}/probe2; '
            "echo ATTACK-DONE"
        )
        return [turn(fix_call()), turn(exec_call(attack)), turn(message("fixed"))]

    done = run_scripted(script, env={"TMPDIR": str(tmpdir)})
    # (codex itself, not the agent, leaves its bubblewrap mount targets there)
    assert not (tmpdir / "probe").exists() and not (tmpdir / "probe2").exists()
    assert str(done.job).startswith("/tmp/"), "the job root must lie under /tmp for this test to mean anything"
    assert done.exit_code == 0, done.stderr[-2000:]
    assert done.result["terminal_state"] == "resolved"
    assert done.run["phase_status"]["codex"] == "ok"  # nothing to restore: every write was denied
    assert read_json(done.job / "result-markers" / "extract.json")["status"] == "ok"
    assert not (done.job / "logs" / "evil.txt").exists() and not probe.exists()
    events = done.codex_events()
    assert "ATTACK-DONE" in events and "Read-only file system" in events


def test_an_environment_dump_in_the_tree_shows_no_key(run_scripted) -> None:
    dump = 'env > envdump.txt; echo "HOME=$HOME" >> envdump.txt'
    done = run_scripted([turn(fix_call()), turn(exec_call(dump)), turn(message("fixed"))])
    assert done.exit_code == 0, done.stderr[-2000:]
    dumped = (done.job / "buggy-source" / "envdump.txt").read_text()
    assert "PATH=" in dumped  # the dump is real
    for value in (KEY_VALUE, OPENAI_VALUE, PLANTED):
        assert value not in dumped
    assert KEY_VARIABLE not in dumped and "OPENAI_API_KEY" not in dumped and "CODEX_HOME" not in dumped
    assert f"HOME={done.job}/agent-home" in dumped  # a private scratch HOME, not the operator's
    patch = (done.job / "Patches" / "stub_calc" / "attempt.patch").read_text()
    assert "envdump.txt" in patch and KEY_VALUE not in patch and OPENAI_VALUE not in patch


def test_the_operators_dotfiles_do_not_run(run_scripted, tmp_path: Path) -> None:
    """A login shell would source ~/.bashrc and /etc/profile; the agent's commands run plain ``bash -c``."""
    done = run_scripted([turn(exec_call("echo shell-opts=$-; shopt -q login_shell && echo LOGIN || echo NOLOGIN")),
                         turn(message("nothing to fix"))])
    events = done.codex_events()
    assert "NOLOGIN" in events and "bash -lc" not in events
    # nothing written to HOME either, but the runner's private CODEX_HOME (the metered session record)
    assert sorted(p.name for p in (done.job / "agent-home").iterdir()) == ["codex-home"]


def test_precheck_names_a_missing_provider_key(stub_image: str, real_codex: Path, tmp_path: Path) -> None:
    home = write_codex_home(tmp_path / "codex-home", "http://127.0.0.1:9/v1")
    done = run_cli("--precheck", "--image", stub_image, "--codex-bin", str(real_codex), f"--codex-home={home}")
    assert done.returncode == 3
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["codex_login"]["ok"] is False and KEY_VARIABLE in checks["codex_login"]["detail"]
    assert all(c["ok"] for name, c in checks.items() if name != "codex_login")


def test_precheck_says_codex_is_not_logged_in(stub_image: str, real_codex: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty-codex-home"
    empty.mkdir()
    done = run_cli(
        "--precheck", "--image", stub_image, "--codex-bin", str(real_codex), f"--codex-home={empty}",
        env={"OPENAI_API_KEY": "", "CODEX_API_KEY": ""},
    )
    assert done.returncode == 3
    login = next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "codex_login")
    assert login["ok"] is False and "codex login" in login["detail"]


def test_without_the_guards_the_agent_reaches_tmp_and_the_key(real_codex: Path, tmp_path: Path) -> None:
    """The control: codex's defaults open /tmp and pass the key on, so the guard tests above can fail."""
    probe = Path("/tmp") / f"runner-control-{secrets.token_hex(6)}"
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    script = [turn(exec_call(f'echo x > {probe}; echo y > "$TMPDIR/control"; env > envdump.txt')), turn(message("done"))]
    with ScriptedModel(script) as model:
        home = write_codex_home(tmp_path / "codex-home", model.base_url)
        done = subprocess.run(
            [str(real_codex), "exec", "--json", "--ephemeral", "--sandbox", "workspace-write", "--cd", str(work), "-"],
            input=b"go", capture_output=True, timeout=120,
            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CODEX_HOME": str(home), KEY_VARIABLE: KEY_VALUE,
                 "TMPDIR": str(tmpdir)},
        )
    try:
        assert done.returncode == 0, done.stderr[-2000:]
        assert probe.exists() and (tmpdir / "control").exists() and KEY_VALUE in (work / "envdump.txt").read_text()
    finally:
        probe.unlink(missing_ok=True)


def _canary(real_codex: Path, base: str, codex_bin: Path | None = None) -> tuple[int, dict]:
    done = run_cli("--precheck", "--canary", f"--canary-base-image={base}", "--codex-bin", str(codex_bin or real_codex),
                   timeout=900)
    assert done.stdout, done.stderr[-2000:]
    return done.returncode, json.loads(done.stdout)


def test_the_canary_is_healthy_on_this_host(real_codex: Path, canary_base: str) -> None:
    leftovers = set(Path("/tmp").glob("runner-canary-*"))
    code, report = _canary(real_codex, canary_base)
    assert code == 0, report
    assert report["healthy"] is True and report["terminal_state"] == "resolved"
    names = [check["name"] for check in report["checks"]]
    assert {"canary_resolved", "guard_job_root_not_writable", "guard_tmp_not_writable", "guard_provider_key_hidden",
            "guard_secrets_hidden", "guard_private_home"} <= set(names)
    assert all(check["ok"] for check in report["checks"])
    assert set(Path("/tmp").glob("runner-canary-*")) == leftovers  # its scratch job root is gone


def test_the_canary_fails_when_codex_runs_without_the_guards(real_codex: Path, canary_base: str, tmp_path: Path) -> None:
    """A codex wrapper that drops every ``-c``: the agent then writes /tmp and the job root, and sees the key."""
    wrapper = tmp_path / "codex-without-guards"
    wrapper.write_text(
        "#!/usr/bin/env python3\nimport os, sys\nargs, out = sys.argv[1:], []\nwhile args:\n"
        "    a = args.pop(0)\n    if a == '-c':\n        args.pop(0)\n        continue\n    out.append(a)\n"
        f"os.execv({str(real_codex)!r}, [{str(real_codex)!r}, *out])\n"
    )
    wrapper.chmod(0o755)
    code, report = _canary(real_codex, canary_base, codex_bin=wrapper)
    assert code == 3 and report["healthy"] is False
    failed = {check["name"] for check in report["checks"] if not check["ok"]}
    # HOME, and the allowlist that keeps other secrets from codex itself, are the runner's environment,
    # not -c overrides: those two guards still hold
    assert failed >= {"canary_resolved", "guard_job_root_not_writable", "guard_tmp_not_writable",
                      "guard_provider_key_hidden"}
    assert "guard_private_home" not in failed and "guard_secrets_hidden" not in failed


def test_the_canary_names_a_missing_base_image(real_codex: Path, canary_base: str) -> None:
    code, report = _canary(real_codex, "runner-no-such-base:none")
    assert code == 3 and report["healthy"] is False
    failed = [check for check in report["checks"] if not check["ok"]]
    assert failed[0]["name"] == "canary_base_image_missing" and "--canary-base-image" in failed[0]["detail"]
