"""``python -m runner --precheck --canary``: the whole pipeline, the real codex, a scripted model.

It proves on this host, with no credentials and no tokens, that Docker, codex's
sandbox, the environment guards and the evaluation all work: it builds the stub
task image if missing, starts the built-in scripted model (runner/canary/model_server.py),
and runs ``python -m runner --execute`` on a scratch job root under the system's
temporary directory. The scripted agent fixes the stub's bug, runs the check the
ordinary way (leaving bytecode), then tries what a careless or hostile agent
would: write into the job root and into ``/tmp``, and print its environment and HOME.

Healthy (exit 0) only when the run ends resolved and every guard held; else exit 3.
The report names each check; it carries no host path and no secret.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import structlog

from runner.canary.model_server import (
    KEY_VARIABLE,
    ScriptedModel,
    apply_patch_command,
    exec_call,
    message,
    turn,
    write_codex_home,
)
from runner.agents import AgentName, agent_for
from runner.canary.stub_image import ensure_stub_image
from runner.docker_utils import connect
from runner.errors import EnvironmentNotReadyError, ExitCode
from runner.jobroot import AGENT_HOME, BENCHMARK_RUN, BENCHMARK_RESULT, LOGS, MARKERS
from runner.phases.precheck import Check, codex_version
from runner.settings import ENV_OF_FIELD, TASK_ENV, RunnerSettings

log = structlog.get_logger(__name__)

TAG = "stub_calc"
CODEX_TIMEOUT = 300
EVAL_TIMEOUT = 120
RUN_TIMEOUT = 900
PROMPT = "Fix calc.mathops.add: it must return the sum of its arguments. Run the check afterwards.\n"
# The stub's fix, in codex's apply_patch format; codex applies it as a file change.
STUB_FIX = (
    "*** Update File: calc/mathops.py\n"
    "@@\n"
    ' def add(a, b):\n'
    '     """Return the sum of a and b."""\n'
    "-    return a - b\n"
    "+    return a + b\n"
)
RUN_THE_CHECK = "python3 -c 'from calc import mathops; assert mathops.add(2, 3) == 5' && echo CHECK-PASSED"


# The same fix as a shell command, for an agent whose shell has no apply_patch (Claude Code).
SHELL_FIX = "sed -i 's/return a - b/return a + b/' calc/mathops.py"


def fix_call(agent: AgentName = AgentName.CODEX) -> dict[str, Any]:
    return exec_call(apply_patch_command(STUB_FIX) if agent is AgentName.CODEX else SHELL_FIX)


def canary_script(job_root: Path, tmp_probe: Path, agent: AgentName = AgentName.CODEX) -> list[dict[str, Any]]:
    """The agent's turns: fix, check, then the probes of every guard."""
    probe = (
        f"echo forged > {job_root}/{MARKERS}/canary-probe.json; "
        f"echo forged > {tmp_probe}; "
        'echo "HOME=$HOME"; env'
    )
    return [turn(fix_call(agent)), turn(exec_call(RUN_THE_CHECK)), turn(exec_call(probe)), turn(message("fixed"))]


def _check(name: str, ok: bool, detail: str) -> Check:
    return Check(name=name, ok=ok, detail=detail)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _run(settings: RunnerSettings, image: str, scratch: Path) -> tuple[list[Check], dict[str, Any]]:
    job = scratch / "job"
    (job / "context").mkdir(parents=True)
    (job / "context" / "prompt.md").write_text(PROMPT)
    tmp_probe = Path(tempfile.gettempdir()) / f"runner-canary-{secrets.token_hex(8)}"
    key_value = "canary-" + secrets.token_hex(16)  # stands in for a provider key
    planted = "canary-planted-" + secrets.token_hex(16)  # a secret of the operator's environment
    agent = settings.agent
    with ScriptedModel(canary_script(job, tmp_probe, agent), final_text="fixed") as model:
        codex_home = write_codex_home(scratch / "codex-home", model.base_url)
        env = {
            **{k: v for k, v in os.environ.items() if k not in TASK_ENV | {ENV_OF_FIELD["codex_home"]}},
            KEY_VARIABLE: key_value,
            "RUNNER_CANARY_SECRET_TOKEN": planted,
        }
        argv = [
            sys.executable, "-m", "runner", "--execute", f"--job-root={job}", f"--tag={TAG}", f"--image={image}",
            f"--codex-bin={settings.codex_bin}", f"--codex-home={codex_home}",
            f"--codex-timeout={CODEX_TIMEOUT}", f"--eval-timeout={EVAL_TIMEOUT}",
        ]
        if agent is not AgentName.CODEX:  # the same scripted model, in Anthropic's wire format
            env |= {"ANTHROPIC_BASE_URL": model.anthropic_base_url, "ANTHROPIC_API_KEY": key_value}
            env.pop("ANTHROPIC_AUTH_TOKEN", None)
            argv += [f"--agent={agent.value}", f"--claude-bin={settings.claude_bin}"]
            if settings.bwrap_bin is not None:
                argv.append(f"--bwrap-bin={settings.bwrap_bin}")
        try:
            done = subprocess.run(argv, env=env, capture_output=True, timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL)
            exit_code = done.returncode
        except subprocess.TimeoutExpired:
            exit_code = None
        requests = model.requests
    run = _read_json(job / BENCHMARK_RUN)
    result = _read_json(job / BENCHMARK_RESULT)
    codex_log = job / LOGS / agent_for(agent).stdout_log
    events = codex_log.read_bytes() if codex_log.is_file() else b""
    tmp_written = tmp_probe.exists()
    tmp_probe.unlink(missing_ok=True)
    agent_home = f"HOME={job / AGENT_HOME}".encode()
    checks = [
        _check("canary_run_completed", exit_code == 0,
               f"python -m runner --execute exited with {exit_code}" if exit_code is not None else "timed out"),
        _check("canary_model_used", requests >= 4, f"the scripted model answered {requests} requests (4 expected)"),
        _check("canary_resolved", result.get("terminal_state") == "resolved",
               f"terminal state {result.get('terminal_state')}, label {result.get('failure_attribution_labels')}"),
        _check("guard_job_root_not_writable", not (job / MARKERS / "canary-probe.json").exists()
               and run.get("phase_status", {}).get("codex") == "ok",
               "the agent's write into the job root was denied by the sandbox"),
        _check("guard_tmp_not_writable", not tmp_written, "the agent's write into the temporary directory was denied"),
        _check("guard_provider_key_hidden", bool(events) and key_value.encode() not in events,
               "the provider key did not reach the agent's commands"),
        _check("guard_secrets_hidden", bool(events) and planted.encode() not in events,
               "a secret-looking variable of the runner's environment did not reach the agent's commands"),
        _check("guard_private_home", agent_home in events, "the agent's HOME was the job root's private scratch directory"),
        _check("patch_without_artifacts", run.get("binary_change_count") == 0 and run.get("changed_file_count") == 1,
               f"the patch changed {run.get('changed_file_count')} file(s), {run.get('binary_change_count')} binary"),
    ]
    summary = {
        "terminal_state": result.get("terminal_state"),
        "first_failed_phase": run.get("first_failed_phase"),
        "artifact_files_left_out": run.get("artifact_files_left_out"),
        "tokens": run.get("metrics"),
    }
    return checks, summary


def run_canary(settings: RunnerSettings) -> tuple[dict[str, Any], int]:
    """The canary's report and exit code (0 healthy, 3 not)."""
    report: dict[str, Any] = {"mode": "precheck", "canary": True}
    checks: list[Check] = []
    try:
        if settings.agent is AgentName.CODEX:
            report["codex_version"] = codex_version(settings.codex_bin)
        else:
            report["agent"], report["agent_version"] = settings.agent.value, agent_for(settings.agent).version(settings)
        client = connect()
        try:
            image, built = ensure_stub_image(client, settings.canary_base_image)
        finally:
            client.close()
        checks.append(_check("canary_stub_image", True, "built now" if built else "present"))
        scratch = Path(tempfile.mkdtemp(prefix="runner-canary-"))
        try:
            run_checks, summary = _run(settings, image, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        checks += run_checks
        report.update(summary)
    except EnvironmentNotReadyError as e:
        checks.append(_check(e.reason, False, str(e)))
    healthy = bool(checks) and all(check.ok for check in checks)
    report["healthy"] = healthy
    report["checks"] = [check.model_dump() for check in checks]
    log.info("canary_finished", healthy=healthy)
    return report, int(ExitCode.COMPLETED if healthy else ExitCode.BAD_ENVIRONMENT)
