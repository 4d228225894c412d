"""codex: ``codex exec --json`` as a guarded subprocess in the buggy source.

Invariants:
- the prompt file's contents go on stdin (``-``), never its path as the prompt;
- the agent is given only ``buggy-source/`` (``--cd``), never the job root;
- the child's environment is an allowlist (plus the provider key variable the
  active config names), and is never logged; its HOME is a private scratch
  directory of the job root and CODEX_HOME the operator's, resolved before;
- the runner's guards go on the command line as ``-c`` overrides, after the
  operator's (``runner/codex_config.py``), so no config file can drop them;
- stdout (JSONL events) and stderr go to private files under ``logs/``, never into
  memory; only the token counts are read back from them;
- codex gets a private CODEX_HOME linked to the operator's (``runner.codex_meter``): its
  session record stays in the job root, and the meter reads the usage from it as it grows,
  so a cap (``--max-tokens``, ``--max-cost-usd``) stops codex between model responses, and a
  run killed at its deadline still has its tokens counted and priced;
- the child runs in its own process group, and the whole group is killed at
  the deadline, on interrupt, and after it exits; then every other descendant
  (the agent's commands run in groups of their own) is found and killed too.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog

from reducers.models import CodexResult, Reason
from runner.atomic import open_private
from runner.codex_config import (
    active_provider,
    guard_arguments,
    operator_home,
    overrides_sha256,
    resolve_codex_home,
)
from runner.codex_meter import LIVE_USAGE, UsageMeter, private_codex_home, write_live_usage
from runner.codex_usage import CodexUsage, TokenCounts, usage_from_events
from runner.containment.agent import agent_process, hand_over, resolve_agent_user
from runner.containment.descendants import become_subreaper, kill_descendants
from runner.context import JobContext, sha256_file
from runner.errors import AgentNotContainedError, CodexNotFoundError, PhaseError
from runner.phases.prepare import read_prompt
from runner.pricing import RateCard, load_rate_card, price
from runner.settings import SAFE_MODEL
from runner.containment.runner_files import RunnerFilesSnapshot, same_file

log = structlog.get_logger(__name__)

# What codex needs to run and authenticate; everything else of the host stays out.
ENV_ALLOWLIST = frozenset(
    {
        "PATH", "HOME", "CODEX_HOME", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR", "USER", "LOGNAME",
        "OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID", "CODEX_API_KEY",
        "CODEX_ACCESS_TOKEN", "SSL_CERT_FILE", "SSL_CERT_DIR", "HTTPS_PROXY", "HTTP_PROXY",
        "NO_PROXY", "https_proxy", "http_proxy", "no_proxy",
    }
)
STDOUT_LOG = "codex.stdout.log"
STDERR_LOG = "codex.stderr.log"
PRIVATE_CODEX_HOME = "codex-home"  # in the agent's scratch HOME
METER_SECONDS = 0.25  # how often the meter reads the session record while codex runs


def child_environment(
    environ: Mapping[str, str], *, provider_key: str | None = None, home: Path | None = None,
    codex_home: Path | None = None,
) -> dict[str, str]:
    """The allowlist, the active provider's key variable, and HOME/CODEX_HOME when given.

    With a HOME given and no CODEX_HOME, codex uses (and makes) one under that HOME.
    """
    env = {k: v for k, v in environ.items() if k in ENV_ALLOWLIST or k.startswith("LC_") or k == provider_key}
    if home is not None:
        env["HOME"] = str(home)
        env.pop("CODEX_HOME", None)
    if codex_home is not None:
        env["CODEX_HOME"] = str(codex_home)
    return env


def codex_argv(
    codex_path: str, buggy_source: Path, last_message: Path, *,
    model: str | None = None, profile: str | None = None, overrides: Sequence[str] = (),
) -> list[str]:
    """The operator's model, profile and overrides first, the runner's guards last (a later -c wins)."""
    chosen = [*(["--model", model] if model else []), *(["--profile", profile] if profile else [])]
    return [
        codex_path, "exec",
        "--json",
        "--ignore-rules",
        "--sandbox", "workspace-write",
        "--cd", str(buggy_source),
        "--output-last-message", str(last_message),
        *chosen,
        *[arg for item in overrides for arg in ("-c", item)],
        *guard_arguments(),
        "-",
    ]


def _fresh_home(path: Path) -> Path:
    """codex's HOME: empty at every start, so nothing of an earlier run or of the operator runs."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
    path.mkdir(mode=0o700)
    return path


def _last_message_present(path: Path) -> bool:
    """Non-empty: codex writes an empty file when the turn failed."""
    try:
        if path.is_symlink() or not path.is_file():
            return False
        with path.open("rb") as handle:
            return bool(handle.read(4096).strip())
    except OSError:
        return False


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the directory itself, never through a link; None if not a directory."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    return (found.st_dev, found.st_ino) if stat.S_ISDIR(found.st_mode) else None


@dataclass
class _Spending:
    """The caps of one attempt, checked against each running total the meter reads."""

    card: RateCard
    model: str | None
    max_tokens: int | None
    max_cost_usd: float | None
    live_usage: Path
    seen: TokenCounts | None = None
    exceeded: str | None = None  # "max_tokens" or "max_cost_usd"

    def saw(self, usage: TokenCounts | None) -> bool:
        """Record ``usage``; True when it crosses a cap."""
        if usage is None or usage == self.seen:
            return False
        self.seen = usage
        cost = price(usage, self.model, self.card)
        write_live_usage(self.live_usage, usage, cost)
        if self.max_tokens is not None and usage.total > self.max_tokens:
            self.exceeded = "max_tokens"
        elif self.max_cost_usd is not None and cost is not None and cost > self.max_cost_usd:
            self.exceeded = "max_cost_usd"
        return self.exceeded is not None


def _wait_metered(child: subprocess.Popen[bytes], meter: UsageMeter, spending: _Spending, timeout: float) -> tuple[int, bool]:
    """Wait for codex, reading its usage; kill its group at the deadline or a cap. (exit code, timed out)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return child.wait(timeout=max(min(METER_SECONDS, deadline - time.monotonic()), 0.001)), False
        except subprocess.TimeoutExpired:
            pass
        if spending.saw(meter.poll()):
            log.warning("codex_budget_exceeded", cap=spending.exceeded, total_tokens=spending.seen.total)
            _kill_group(child.pid)
            return child.wait(), False
        if time.monotonic() >= deadline:
            _kill_group(child.pid)
            return child.wait(), True


def _merged(reported: CodexUsage, metered: TokenCounts | None) -> TokenCounts:
    """The counts codex reported at its end, or the meter's running total when that is larger
    (a run killed at a cap or a deadline reports nothing at its end)."""
    final = reported.tokens_only()
    return metered if metered is not None and metered.total > final.total else final


def _model_of(settings_model: str | None, provider_model: str | None) -> str | None:
    return settings_model or (provider_model if provider_model and SAFE_MODEL.fullmatch(provider_model) else None)


def codex(ctx: JobContext) -> CodexResult:
    """Raises: CodexNotFoundError; PhaseError on a non-zero exit or the deadline."""
    settings, job = ctx.settings, ctx.job
    read_prompt(ctx)  # refuses a missing, empty or placeholder prompt
    found = shutil.which(settings.codex_bin)
    if found is None:
        raise CodexNotFoundError(settings.codex_bin)
    codex_path = os.path.abspath(found)  # codex runs in buggy-source: a relative path would miss
    card = load_rate_card(settings.rate_card)  # a bad card is refused before codex runs
    codex_home = resolve_codex_home(settings.codex_home, os.environ, operator_home())
    provider = active_provider(codex_home, settings.codex_profile, settings.codex_config)
    model = _model_of(settings.model, provider.model)
    if card.rates(model) is None:  # the cost is unknown; a warning when someone could act on it
        warn = log.warning if model is not None or settings.max_cost_usd is not None else log.info
        warn("model_not_on_rate_card", model=model, cost_known=False,
             cost_cap_enforced=False if settings.max_cost_usd is not None else None,
             hint="name the model (--model) and price it (--rate-card)" if model is None else "price it (--rate-card)")
    stdout_path, stderr_path = job.logs / STDOUT_LOG, job.logs / STDERR_LOG
    job.last_message.unlink(missing_ok=True)
    argv = codex_argv(
        codex_path, job.buggy_source, job.last_message,
        model=settings.model, profile=settings.codex_profile, overrides=settings.codex_config,
    )
    home = _fresh_home(job.agent_home)
    private_home = private_codex_home(codex_home if codex_home.is_dir() else None, home / PRIVATE_CODEX_HOME)
    environment = child_environment(os.environ, provider_key=provider.env_key, home=home, codex_home=private_home)
    meter = UsageMeter(private_home)
    spending = _Spending(card, model, settings.max_tokens, settings.max_cost_usd, job.logs / LIVE_USAGE)
    (job.logs / LIVE_USAGE).unlink(missing_ok=True)
    # the runner writes the live usage itself while codex runs; only a batch's budget reads it, never a result
    own_logs = frozenset(job.relative(path) for path in (stdout_path, stderr_path, job.logs / LIVE_USAGE))
    if _identity(job.buggy_source) is None:
        raise PhaseError("codex", "codex_replaced_source",
                         "buggy-source/ is not a directory (a link, or gone); move it aside and start over")
    agent = resolve_agent_user(settings.agent_user)
    if agent is not None:
        hand_over(job.buggy_source, agent)  # its tree, and nothing else of the job root
        hand_over(job.agent_home, agent)  # and its scratch HOME, outside the tree
        with open_private(job.last_message):  # codex writes its last message there, and nowhere else
            os.chown(job.last_message, agent.uid, agent.gid)
    source_before = _identity(job.buggy_source)  # the very directory, to find it replaced afterwards
    snapshot = RunnerFilesSnapshot.capture(job.root, skip=own_logs)
    become_subreaper()  # orphans of the agent's commands come to the runner, to be killed
    started = time.monotonic()
    timed_out = False
    with job.prompt.open("rb") as prompt_file, open_private(stdout_path) as out, open_private(stderr_path) as err:
        try:
            with agent_process(
                argv,
                journal=ctx.journal,
                run_id=ctx.run_id,
                agent=agent,
                stdin=prompt_file,  # a file, not a pipe: the deadline runs from the start, whatever codex reads
                stdout=out,
                stderr=err,
                cwd=job.buggy_source,
                env=environment,
            ) as child:
                log.info("codex_started", pid=child.pid, timeout_seconds=settings.codex_timeout,
                         max_tokens=settings.max_tokens, max_cost_usd=settings.max_cost_usd)
                exit_code, timed_out = _wait_metered(child, meter, spending, settings.codex_timeout)
        except AgentNotContainedError as e:
            raise PhaseError("codex", "agent_not_contained", f"{e}; the attempt is not trusted") from e
        finally:
            stragglers = kill_descendants()  # the agent's commands, in groups of their own
            if stragglers:  # the agent's leftover commands: ended as the contract says, not a fault
                log.info("codex_stragglers_killed", count=stragglers)
            tampered = snapshot.restore()
            for path, handle in ((stdout_path, out), (stderr_path, err)):
                if not same_file(handle, path):
                    tampered.append(job.relative(path))
                    path.unlink(missing_ok=True)  # no longer the runner's log: never read it
    if ctx.journal is not None:
        ctx.journal.agent_ended()  # every process of it is gone (the tamper check ran)
    if _identity(job.buggy_source) != source_before:
        raise PhaseError(
            "codex",
            "codex_replaced_source",
            "buggy-source/ is no longer the directory the agent was given (replaced, or a link); "
            "the attempt is not trusted and no patch is taken from it",
            exit_code=exit_code,
        )
    if tampered:
        raise PhaseError(
            "codex",
            "codex_wrote_runner_files",
            f"codex changed {len(tampered)} of the runner's files (first: {sorted(tampered)[0]}); "
            "they were restored or removed and the attempt is not trusted",
            exit_code=exit_code,
            details={"runner_files_touched": len(tampered), "timed_out": timed_out},
        )
    usage = usage_from_events(stdout_path)
    tokens = _merged(usage, meter.poll())  # with the responses that completed after the last poll
    cost = price(tokens, model, card)
    if timed_out:
        reason = Reason.CODEX_TIMEOUT
    elif exit_code == 0 or spending.exceeded:  # stopped at a cap: the work so far is patched and scored
        reason = Reason.OK
    else:
        reason = Reason.CODEX_MODEL_ERROR if usage.model_error else Reason.CODEX_EXIT_NONZERO
    result = CodexResult(
        exit_code=exit_code,
        reason=reason,
        timed_out=timed_out,
        duration_seconds=round(time.monotonic() - started, 3),
        stdout_sha256=sha256_file(stdout_path),
        stderr_sha256=sha256_file(stderr_path),
        stdout_bytes=stdout_path.stat().st_size,
        stderr_bytes=stderr_path.stat().st_size,
        last_message_present=_last_message_present(job.last_message),
        **asdict(tokens),
        turns=usage.turns,
        failed_turns=usage.failed_turns,
        model_error=usage.model_error if reason is Reason.CODEX_MODEL_ERROR else None,
        infra_failure=reason is Reason.CODEX_MODEL_ERROR,
        model=model,
        codex_overrides_sha256=overrides_sha256(settings.codex_config),
        cost_usd=cost,
        cost_known=cost is not None,
        rate_card_sha256=card.sha256,
        budget_exceeded=spending.exceeded is not None,
        budget_reason=spending.exceeded,
    )
    if result.reason is not Reason.OK:
        if timed_out:
            message = (
                f"codex passed the deadline of {settings.codex_timeout:g}s and was killed with its process group; "
                f"what it was doing is in logs/{STDOUT_LOG} and logs/{STDERR_LOG}"
            )
        elif reason is Reason.CODEX_MODEL_ERROR:
            message = (
                f"the model provider failed ({usage.model_error}), an infrastructure failure, not the agent's; "
                f"codex exited with {exit_code}; see logs/{STDOUT_LOG}"
            )
        else:
            message = f"codex exited with {exit_code}; see logs/{STDERR_LOG}"
        raise PhaseError("codex", result.reason, message, exit_code=exit_code, details=result.model_dump())
    return result
