"""The real Claude Code CLI in the loop, against the scripted model in Anthropic's format, on the stub image.

Every case runs ``python -m runner --execute --agent claude-code`` as an operator would, with
the real ``claude`` and the local model server (runner/canary/model_server.py) serving the
Messages API's stream; the same guard checks as the real-codex tests: the job root and
``/tmp`` unwritable, no key in the agent's commands, the prompt received, a killed runner
leaving nothing of the agent running. Skips without the real CLI, except under CI=true.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from runner.canary.model_server import MODEL, ScriptedModel, exec_call, fault, message, turn
from runner.canary.run import RUN_THE_CHECK, SHELL_FIX as FIX_COMMAND
from tests.conftest import (
    IN_CI,
    CompactRun,
    RunningCli,
    agent_gone,
    log_events,
    make_job_root,
    read_json,
    run_cli,
    stub_args,
)

pytestmark = [pytest.mark.docker, pytest.mark.real_claude_code, pytest.mark.usefixtures("no_leaked_containers")]

KEY_VALUE = "sk-ant-scripted-" + secrets.token_hex(12)
PLANTED = "planted-secret-" + secrets.token_hex(12)
PROMPT = "Fix calc.mathops.add so that it returns the sum. " + secrets.token_hex(6) + "\n"
# The stub's fix as a shell command: Claude Code's Bash tool has no apply_patch.
SHELL_FIX = exec_call(f"{FIX_COMMAND} && echo FIXED")
# Dollars per million tokens of the scripted model, Anthropic's disjoint counts.
DISJOINT_CARD = f"""version = "test-anthropic"
[models."{MODEL}"]
input_per_million = 3.0
cached_input_per_million = 0.3
cache_write_per_million = 3.75
output_per_million = 15.0
usage = "disjoint"
"""


@pytest.fixture(scope="module")
def real_claude() -> Path:
    found = os.environ.get("CLAUDE_CODE_BIN") or shutil.which("claude")
    if found is None or shutil.which("codex") is None:  # its bubblewrap confines Claude Code
        if IN_CI:
            pytest.fail("CI=true and the real Claude Code CLI or the Codex CLI is not installed "
                        "(npm install -g @anthropic-ai/claude-code @openai/codex)")
        pytest.skip("the real Claude Code CLI or the Codex CLI is not installed")
    return Path(found)


@dataclass
class Run(CompactRun):
    requests: int = 0
    bodies: list[dict] = field(default_factory=list)

    def events(self) -> str:
        return (self.job / "logs" / "claude-code.stdout.log").read_text(errors="replace")


def _claude_args(job: Path, image: str, claude: Path, *extra: str) -> list[str]:
    return [*stub_args(job, image), "--agent", "claude-code", "--claude-bin", str(claude), *extra]


@pytest.fixture
def run_scripted(tmp_path: Path, stub_image: str, real_claude: Path) -> Iterator:
    def run(script, *extra: str, env: dict[str, str] | None = None, under: Path | None = None) -> Run:
        job = make_job_root(under or tmp_path, PROMPT)
        if callable(script):
            script = script(job)
        with ScriptedModel(script, per_conversation=True) as model:
            done = run_cli(
                "--execute", *_claude_args(job, stub_image, real_claude, "--codex-timeout=120", *extra),
                env={"ANTHROPIC_BASE_URL": model.anthropic_base_url, "ANTHROPIC_API_KEY": KEY_VALUE,
                     "DEPLOY_SECRET_TOKEN": PLANTED, **(env or {})},
            )
            requests, bodies = model.requests, list(model.bodies)
        return Run(done.returncode, job, done.stderr, requests, bodies)

    yield run


@dataclass(frozen=True)
class Attack:
    """What the agent's commands try against the guards: the job root, the host's /tmp and the rest of it."""

    probe: Path = field(default_factory=lambda: Path("/tmp") / f"runner-claude-probe-{secrets.token_hex(6)}")
    # a host directory not under /tmp
    outside: Path = field(default_factory=lambda: Path("/var/tmp") / f"runner-claude-probe-{secrets.token_hex(6)}")

    def script(self, job: Path) -> list:
        attack = (
            f"echo forged > {job}/result-markers/extract.json; echo forged > {job}/logs/evil.txt; "
            f"echo forged > {self.probe}; echo forged > {self.outside}; env > envdump.txt; "
            "echo \"HOME=$HOME\" >> envdump.txt; id -u >> envdump.txt; echo ATTACK-DONE"
        )
        return [turn(SHELL_FIX), turn(exec_call(RUN_THE_CHECK)), turn(exec_call(attack)), turn(message("fixed"))]

    def held(self, done: Run, changed: int = 2) -> dict:
        """Every guard held and the task resolved (``changed`` files in the patch); the compact run."""
        assert done.exit_code == 0, done.stderr[-3000:]
        assert done.result["terminal_state"] == "resolved"
        run = done.run
        assert run["agent"] == "claude-code" and run["agent_version"].startswith("claude-code ")
        assert run["phase_status"]["codex"] == "ok" and run["codex"]["last_message_present"] is True
        assert (done.job / "codex-last-message.txt").read_text() == "fixed"
        # the prompt reached the model through stdin
        assert PROMPT.strip() in json.dumps(done.bodies[0]["messages"])
        events = done.events()
        assert "CHECK-PASSED" in events and "ATTACK-DONE" in events
        # the job root, the host's /tmp and the rest of the host were out of reach: the job root lies
        # under /tmp here, which the agent sees as a private empty tmpfs; everything else is read-only
        assert str(done.job).startswith("/tmp/"), "the job root must lie under /tmp for this test to mean anything"
        assert "extract.json: No such file or directory" in events and f"{self.outside}: Read-only file system" in events
        assert read_json(done.job / "result-markers" / "extract.json")["status"] == "ok"
        assert not (done.job / "logs" / "evil.txt").exists() and not self.probe.exists() and not self.outside.exists()
        # no key, no secret of the operator's, in the agent's commands; a private HOME
        dumped = (done.job / "buggy-source" / "envdump.txt").read_text()
        assert "PATH=" in dumped and f"HOME={done.job}/agent-home" in dumped
        assert KEY_VALUE not in dumped and "ANTHROPIC_API_KEY" not in dumped and PLANTED not in dumped
        patch = (done.job / "Patches" / "stub_calc" / "attempt.patch").read_text()
        assert "return a + b" in patch and KEY_VALUE not in patch
        assert run["changed_file_count"] == changed  # the fix, the agent's own envdump.txt, nothing of a sandbox's
        assert agent_gone(done.job / "buggy-source")
        return run


def test_claude_code_fixes_the_stub_under_every_guard(run_scripted, tmp_path: Path) -> None:
    card = tmp_path / "card.toml"
    card.write_text(DISJOINT_CARD)
    attack = Attack()
    done = run_scripted(attack.script, f"--model={MODEL}", f"--rate-card={card}")
    run = attack.held(done)
    assert (done.job / "buggy-source" / "envdump.txt").read_text().splitlines()[-1] == "0"  # as the runner: root
    # four responses of the conversation, Anthropic's disjoint counts, priced on the card
    metrics = run["metrics"]
    assert (metrics["input_tokens"], metrics["cache_tokens"], metrics["cache_write_tokens"], metrics["output_tokens"]) \
        == (240, 120, 40, 80)
    expected = (240 * 3.0 + 120 * 0.3 + 40 * 3.75 + 80 * 15.0) / 1_000_000
    assert metrics["cost_known"] is True and metrics["cost_usd"] == pytest.approx(expected)
    marker = read_json(done.job / "result-markers" / "codex.json")
    assert marker["details"]["agent"] == "claude-code" and marker["details"]["turns"] >= 4


def test_claude_code_as_an_unprivileged_agent_user_under_every_guard(run_scripted, open_tmp: Path) -> None:
    """``--agent-user nobody``: the same guards, Claude Code and its commands as that user, its commands offline."""
    if os.geteuid() != 0:
        pytest.skip("--agent-user needs the runner to run as root")
    nobody = pwd.getpwnam("nobody").pw_uid
    attack = Attack()

    def script(job: Path) -> list:
        job.chmod(0o711)  # the agent user reaches buggy-source/ and its HOME, nothing else of the job root
        offline = "(exec 3<>/dev/tcp/127.0.0.1/9) 2> net.txt; echo \"exit=$?\" >> net.txt"
        first, *rest = attack.script(job)
        return [turn(exec_call(f"{offline}; echo OFFLINE-TRIED")), first, *rest]

    done = run_scripted(script, "--agent-user", "nobody", under=open_tmp)
    attack.held(done, changed=3)  # and its net.txt
    assert (done.job / "buggy-source" / "envdump.txt").read_text().splitlines()[-1] == str(nobody)
    assert (done.job / "buggy-source" / "calc" / "mathops.py").stat().st_uid == nobody  # the agent's own write
    tried = (done.job / "buggy-source" / "net.txt").read_text()
    assert "Network is unreachable" in tried and "exit=1" in tried, tried


class Listener:
    """A TCP port listening on the host's 127.0.0.1, counting the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()

    def __enter__(self) -> Listener:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


def test_claude_code_reaches_its_model_but_its_commands_have_no_network(run_scripted) -> None:
    """A port listening on the host's loopback: Claude Code's API calls go out, its commands' connections do not."""
    with Listener() as listener:
        reach = (
            f"(exec 3<>/dev/tcp/127.0.0.1/{listener.port}) 2> net.txt; echo \"bash-exit=$?\" >> net.txt; "
            f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {listener.port}), timeout=3)' "
            "2>> net.txt; echo \"python-exit=$?\" >> net.txt; echo NET-TRIED"
        )
        done = run_scripted([turn(exec_call(reach)), turn(SHELL_FIX), turn(exec_call(RUN_THE_CHECK)), turn(message("fixed"))])
        assert listener.accepted == 0, "a command of the agent connected to the host's loopback"
        with socket.create_connection(("127.0.0.1", listener.port), timeout=3):
            pass  # the control: the port took connections from outside the agent's commands
        deadline = time.monotonic() + 5
        while listener.accepted == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert listener.accepted == 1
    assert done.exit_code == 0, done.stderr[-3000:]
    assert done.requests >= 4  # every response of the conversation reached Claude Code over the network
    assert done.result["terminal_state"] == "resolved"
    tried = (done.job / "buggy-source" / "net.txt").read_text()
    assert "Network is unreachable" in tried and "bash-exit=1" in tried and "python-exit=1" in tried, tried
    events = done.events()
    assert "NET-TRIED" in events and "CHECK-PASSED" in events


def test_a_failing_provider_is_an_infrastructure_failure(run_scripted) -> None:
    done = run_scripted([turn(exec_call("echo first")), fault("http_500")], env={"CLAUDE_CODE_MAX_RETRIES": "0"})
    assert done.exit_code == 1, done.stderr[-3000:]
    run = done.run
    assert run["agent"] == "claude-code" and run["first_failed_phase"] == "codex"
    assert run["first_failure_reason"] == "codex_model_error" and run["infra_failure"] is True
    assert run["codex"]["model_error"] == "provider_error"


def test_a_killed_runner_leaves_nothing_of_claude_code_running(tmp_path: Path, stub_image: str,
                                                               real_claude: Path) -> None:
    job = make_job_root(tmp_path, PROMPT)
    script = [turn(exec_call("touch started && sleep 300 && echo never")), turn(message("done"))]
    with ScriptedModel(script, per_conversation=True) as model:
        running = RunningCli("--execute", *_claude_args(job, stub_image, real_claude),
                             env={"ANTHROPIC_BASE_URL": model.anthropic_base_url, "ANTHROPIC_API_KEY": KEY_VALUE})
        running.wait_for_file(job / "buggy-source" / "started", timeout=120)
        running.process.kill()
        running.finish()
        assert agent_gone(job / "buggy-source", seconds=10), "the dead runner's claude (or its sleep) is still alive"


def test_an_unknown_agent_is_refused_before_anything(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path, PROMPT)
    done = run_cli("--execute", *stub_args(job, stub_image), "--agent", "gemini")
    assert done.returncode == 2
    assert "--agent" in done.stderr and "claude-code" in done.stderr
    assert not (job / "result-markers").exists()


def test_a_missing_claude_is_refused_at_the_precheck(tmp_path: Path, stub_image: str) -> None:
    job = make_job_root(tmp_path, PROMPT)
    done = run_cli("--execute", *stub_args(job, stub_image), "--agent", "claude-code",
                   "--claude-bin", str(tmp_path / "no-claude"), env={"ANTHROPIC_API_KEY": KEY_VALUE})
    assert done.returncode == 3
    precheck = read_json(job / "result-markers" / "precheck.json")
    assert precheck["status"] == "failed" and precheck["reason"] == "precheck_claude_code_binary"
    assert "@anthropic-ai/claude-code" in done.stderr and "--claude-bin" in done.stderr
    assert not (job / "buggy-source").exists()  # nothing extracted, no agent started


def test_no_provider_key_is_refused_at_the_precheck(tmp_path: Path, stub_image: str, real_claude: Path) -> None:
    job = make_job_root(tmp_path, PROMPT)
    done = run_cli("--execute", *_claude_args(job, stub_image, real_claude),
                   env={"ANTHROPIC_API_KEY": "", "ANTHROPIC_AUTH_TOKEN": ""})
    assert done.returncode == 3
    precheck = read_json(job / "result-markers" / "precheck.json")
    assert precheck["reason"] == "precheck_claude_code_login"
    assert "ANTHROPIC_API_KEY" in done.stderr and KEY_VALUE not in done.stderr
    assert not (job / "buggy-source").exists()
    checks = log_events(done.stderr, "phase_finished")
    assert any(event.get("phase") == "precheck" and event.get("status") == "failed" for event in checks)


def test_without_the_runners_confinement_claude_code_reaches_tmp_and_the_key(real_claude: Path,
                                                                              tmp_path: Path) -> None:
    """The control: the bare CLI writes the host's /tmp and passes the key on, so the guard test above can fail."""
    probe = Path("/tmp") / f"runner-claude-control-{secrets.token_hex(6)}"
    work = tmp_path / "work"
    work.mkdir()
    script = [turn(exec_call(f"echo x > {probe}; env > envdump.txt")), turn(message("done"))]
    with ScriptedModel(script, per_conversation=True) as model:
        done = subprocess.run(
            [str(real_claude), "-p", "--output-format", "stream-json", "--verbose", "--permission-mode", "dontAsk",
             "--allowedTools", "Bash"],
            input=b"go", capture_output=True, timeout=120, cwd=work,
            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CLAUDE_CONFIG_DIR": str(tmp_path / "cfg"),
                 "ANTHROPIC_BASE_URL": model.anthropic_base_url, "ANTHROPIC_API_KEY": KEY_VALUE},
        )
    try:
        assert done.returncode == 0, done.stderr[-2000:]
        assert probe.exists() and KEY_VALUE in (work / "envdump.txt").read_text()
    finally:
        probe.unlink(missing_ok=True)


def test_a_job_root_of_one_agent_is_not_resumed_by_another(tmp_path: Path, stub_image: str) -> None:
    """codex's attempt is recorded ok in the journal: claude-code on the same job root would skip to the patch."""
    job = make_job_root(tmp_path)  # the fake codex fixes the stub
    first = run_cli("--execute", *stub_args(job, stub_image))
    assert first.returncode == 0, first.stderr[-2000:]
    assert read_json(job / "result-markers" / "prepare.json")["details"]["agent"] == "codex"
    before = (job / "benchmark_run.compact.json").read_bytes()
    again = run_cli("--execute", *stub_args(job, stub_image), "--agent", "claude-code",
                    env={"ANTHROPIC_API_KEY": KEY_VALUE})
    assert again.returncode == 2 and "another --agent" in again.stderr
    assert (job / "benchmark_run.compact.json").read_bytes() == before


def test_one_batch_compares_both_agents_on_the_same_tags(tmp_path: Path, stub_image: str, real_claude: Path) -> None:
    """Four tags, each run by the real codex and the real Claude Code against one scripted model
    speaking both wire formats: one ledger, two agents, side by side."""
    from runner.canary.model_server import KEY_VARIABLE, write_codex_home

    codex = shutil.which("codex")
    assert codex is not None, "the real Codex CLI is needed beside Claude Code"
    jobs = tmp_path / "jobs"
    tags = ["stub_a", "stub_b", "stub_c", "stub_d"]
    for tag in tags:
        (jobs / tag / "context").mkdir(parents=True)
        (jobs / tag / "context" / "prompt.md").write_text(PROMPT)
    with ScriptedModel([turn(SHELL_FIX), turn(message("fixed"))], per_conversation=True) as model:
        home = write_codex_home(tmp_path / "codex-home", model.base_url)
        done = run_cli(
            "--execute", "--jobs-dir", str(jobs), *[arg for tag in tags for arg in ("--tag", tag)],
            "--image", stub_image, "--agents", "codex,claude-code", "--workers", "2",
            "--codex-bin", codex, f"--codex-home={home}", "--claude-bin", str(real_claude), f"--model={MODEL}",
            env={KEY_VARIABLE: KEY_VALUE, "ANTHROPIC_BASE_URL": model.anthropic_base_url, "ANTHROPIC_API_KEY": KEY_VALUE},
            timeout=900,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["ran"] == 8 and summary["resolved"] == 8
    ledger = read_json(jobs / "run-ledger.json")
    rows = {(row["tag"], row["arm"]): row for row in ledger["rows"]}
    assert set(rows) == {(tag, agent) for tag in tags for agent in ("codex", "claude-code")}
    assert all(row["agent"] == arm for (_tag, arm), row in rows.items())
    for tag in tags:
        for agent in ("codex", "claude-code"):
            run = read_json(jobs / tag / agent / "benchmark_run.compact.json")
            assert run["agent"] == agent and run["official_task_score"]["resolved"] is True
    comparison = ledger["comparison"]
    assert comparison == summary["comparison"]
    for agent in ("codex", "claude-code"):
        side = comparison["agents"][agent]
        assert (side["tasks"], side["scored"], side["resolved"], side["resolved_rate"]) == (4, 4, 4, 1.0)
        assert side["pass_at"]["mean_pass_at"]["1"] == 1.0 and side["input_tokens"] > 0
    assert comparison["agents"]["claude-code"]["input_tokens"] == 4 * 2 * 60  # two responses a tag, disjoint counts
    assert comparison["tags"] == {tag: {"claude-code": True, "codex": True} for tag in tags}
    markdown = (jobs / "run-ledger.md").read_text()
    assert "## Agents side by side" in markdown and "| stub_a (claude-code) |" in markdown
    # the suite report compares them too, from the same ledger with the same arithmetic
    assert run_cli("report", "--jobs-dir", str(jobs), "--out", str(tmp_path / "r.md"), "--format", "markdown",
                   ).returncode == 0
    report = (tmp_path / "r.md").read_text()
    for agent in ("codex", "claude-code"):
        side = comparison["agents"][agent]
        assert (f"| {agent} | 4 | 4 | 4 | 100.0% | 100.0% | {side['input_tokens']:,} | {side['output_tokens']:,} |"
                in report), report
    assert all(f"| {tag} | 1/1 resolved, pass@1 100.0%" in report for tag in tags), report
    assert run_cli("report", "--jobs-dir", str(jobs), "--out", str(tmp_path / "r.html")).returncode == 0
    page = (tmp_path / "r.html").read_text()
    assert 'data-chart="resolved-rate-by-agent"' in page and 'class="agents-per-tag"' in page
    assert all(f'data-label="{tag} {agent}"' in page for tag in tags for agent in ("codex", "claude-code"))


def test_the_canary_checks_claude_code_on_this_host(real_claude: Path, canary_base: str) -> None:
    done = run_cli("--precheck", "--canary", f"--canary-base-image={canary_base}", "--agent", "claude-code",
                   "--claude-bin", str(real_claude), timeout=900)
    assert done.stdout, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert done.returncode == 0, report
    assert report["healthy"] is True and report["agent"] == "claude-code"
    assert report["agent_version"].startswith("claude-code ") and report["terminal_state"] == "resolved"
    names = {check["name"] for check in report["checks"] if check["ok"]}
    assert {"canary_resolved", "guard_job_root_not_writable", "guard_tmp_not_writable", "guard_provider_key_hidden",
            "guard_secrets_hidden", "guard_private_home"} <= names


def test_a_cap_stops_claude_code_between_responses_and_the_attempt_is_scored(run_scripted) -> None:
    """Each response's message spends 60 input tokens (and 1 output as its start says): two stay
    under --max-tokens=150, the third crosses it, and Claude Code is stopped while the fourth thinks."""
    script = [turn(SHELL_FIX), turn(exec_call("echo turn-2")), turn(exec_call("echo turn-3")),
              *[turn(exec_call(f"echo turn-{i}"), thinking_seconds=30) for i in range(4, 7)]]
    done = run_scripted(script, "--max-tokens=150")
    assert done.exit_code == 0, done.stderr[-3000:]  # scored: patched and evaluated
    run = done.run
    assert run["codex"]["budget_exceeded"] is True and run["codex"]["budget_reason"] == "max_tokens"
    assert run["codex"]["timed_out"] is False and run["infra_failure"] is False
    assert done.result["terminal_state"] == "resolved"  # the fix came first
    # killed before its result: the meter's sum over the three messages it had finished
    assert run["metrics"]["input_tokens"] == 180 and run["metrics"]["cache_tokens"] == 90
    assert "turn-3" in done.events() and "turn-4" not in done.events()
    assert read_json(done.job / "logs" / "codex.usage.json")["total_tokens"] > 150


# -- the fleet: a worker's Claude Code tasks -------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.redis
def test_a_worker_without_claude_code_fails_its_tasks_as_infrastructure_and_says_so(fleet) -> None:
    """The worker checks the agent a task names: no Claude Code here is the host's failure (retried,
    then failed as infrastructure, never started), while its codex tasks still run, and /healthz says why."""
    import urllib.request

    fleet.prompt("t_claude", PROMPT)
    fleet.prompt("t_fix", "Fix calc.add.\nfake-codex-mode: fix\n")
    port = _free_port()
    jobs = fleet.jobs("host-a")
    worker = fleet.worker("host-a", jobs, "--claude-bin", "no-such-claude", "--max-infra-retries", "1",
                          "--retry-backoff", "0.2", "--http", f"127.0.0.1:{port}", env={"ANTHROPIC_API_KEY": KEY_VALUE})
    assert fleet.submit("s", "--tag", "t_claude", "--agent", "claude-code").returncode == 0
    assert fleet.submit("s", "--tag", "t_fix").returncode == 0
    fleet.wait("both final", lambda: {r["state"] for r in fleet.rows("s").values()} <= {"done", "failed"}
               and len(fleet.rows("s")) == 2)
    rows = fleet.rows("s")
    claude = rows["t_claude/claude-code/1"]  # its arm: the agent
    assert (claude["state"], claude["infra_failure"], claude["failure_label"]) == ("failed", True, "agent_unavailable")
    assert claude["retries"] == 1 and claude["agent"] == "claude-code" and claude["resolved"] is not True
    assert rows["t_fix/1"]["state"] == "done" and rows["t_fix/1"]["resolved"] is True  # its codex tasks still run
    assert not (jobs / "s" / "t_claude").exists()  # never started: no job root, no container
    unavailable = log_events(list(worker.lines), "agent_unavailable")
    assert len(unavailable) == 2 and unavailable[0]["agent"] == "claude-code"
    assert unavailable[0]["failing"] == ["claude_code_binary"]  # the key is set: its login check passes
    starts = [event["task"] for event in log_events(list(worker.lines), "task_started")]
    assert starts == ["t_fix/1"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as answer:
        health = json.loads(answer.read())
        assert answer.status == 200  # it takes work: its codex tasks
    checks = {check["name"]: check for check in health["checks"]}
    assert checks["codex_login"]["ok"] is True and checks["claude_code_binary"]["ok"] is False
    assert "--claude-bin" in checks["claude_code_binary"]["detail"]
    summary = json.loads(fleet.status("--suite", "s").stdout)["suites"][0]["summary"]
    assert summary["infra_failures"] == 1 and summary["resolved_rate_without_infra"] == 1.0
    code, _stdout, stderr = fleet.stop(worker)
    assert code == 0, stderr[-2000:]


@pytest.mark.redis
def test_one_suite_on_a_worker_holds_both_agents_attempts_of_the_same_tags(fleet, real_claude: Path,
                                                                          tmp_path: Path) -> None:
    """``submit --agent claude-code`` beside a codex submission of the same tags, one suite: a real worker
    runs the real Claude Code CLI and the real codex against the scripted model (both wire formats);
    every task ends done and resolved, each row and compact run says its agent, and the status compares them."""
    from runner.canary.model_server import KEY_VARIABLE, write_codex_home

    codex = shutil.which("codex")
    assert codex is not None, "the real Codex CLI is needed beside Claude Code"
    tags = ["stub_a", "stub_b"]
    for tag in tags:
        fleet.prompt(tag, PROMPT)
    jobs = fleet.jobs("host-a")
    tag_args = [arg for tag in tags for arg in ("--tag", tag)]
    with ScriptedModel([turn(SHELL_FIX), turn(message("fixed"))], per_conversation=True) as model:
        home = write_codex_home(tmp_path / "codex-home-real", model.base_url)
        worker = fleet.worker("host-a", jobs, "--claude-bin", str(real_claude), "--codex-bin", codex,
                              f"--codex-home={home}", "--slots", "2",
                              env={"CODEX_HOME": str(home), KEY_VARIABLE: KEY_VALUE,
                                   "ANTHROPIC_BASE_URL": model.anthropic_base_url, "ANTHROPIC_API_KEY": KEY_VALUE})
        for agent in ("claude-code", "codex"):
            submitted = fleet.submit("both", *tag_args, "--agent", agent, "--codex-timeout=120")
            assert submitted.returncode == 0, submitted.stderr[-2000:]
            assert json.loads(submitted.stdout)["queued"] == 2
        keys = {f"{tag}/{arm}" for tag in tags for arm in ("1", "claude-code/1")}
        fleet.wait("every task done", lambda: set(fleet.rows("both")) == keys
                   and all(row["state"] == "done" for row in fleet.rows("both").values()), timeout=600)
        again = fleet.submit("both", *tag_args, "--agent", "claude-code")  # its attempts are there: nothing added
        assert json.loads(again.stdout)["skipped_existing"] == 2
        code, _stdout, stderr = fleet.stop(worker)
    assert code == 0, stderr[-2000:]
    rows = fleet.rows("both")
    for tag in tags:
        for agent, key, root in (("codex", f"{tag}/1", jobs / "both" / tag / "attempt-1"),
                                 ("claude-code", f"{tag}/claude-code/1", jobs / "both" / tag / "claude-code" / "attempt-1")):
            row = rows[key]
            assert row["resolved"] is True and row["agent"] == agent and row["infra_failure"] is False
            assert row["arm"] == (None if agent == "codex" else agent)
            run = read_json(root / "benchmark_run.compact.json")
            assert run["agent"] == agent and run["agent_version"].startswith("claude-code " if agent != "codex" else "codex")
            assert run["official_task_score"]["resolved"] is True
            assert (root / "logs" / f"{agent}.stdout.log").is_file()
    status = json.loads(fleet.status("--suite", "both").stdout)["suites"][0]
    comparison = status["comparison"]
    for agent in ("codex", "claude-code"):
        side = comparison["agents"][agent]
        assert (side["tasks"], side["resolved"], side["resolved_rate"]) == (2, 2, 1.0)
    assert comparison["tags"] == {tag: {"claude-code": True, "codex": True} for tag in tags}
    markdown = fleet.status("--suite", "both", "--format", "markdown").stdout
    assert "| stub_a (claude-code) |" in markdown and "Agents side by side" in markdown
    # the suite report keeps the two agents' attempt 1 of a tag apart and compares them from Redis
    report_path = tmp_path / "both.md"
    shown = run_cli("report", "--suite", "both", "--broker", fleet.url, "--namespace", fleet.namespace,
                    "--out", str(report_path), "--format", "markdown")
    assert shown.returncode == 0, shown.stderr[-2000:]
    report = report_path.read_text()
    assert "## Agents side by side" in report
    assert all(f"| {agent} | 2 | 2 | 2 | 100.0% |" in report for agent in ("codex", "claude-code")), report
    assert all(f"| {tag} #1 {agent} | resolved |" in report for tag in tags for agent in ("codex", "claude-code"))
