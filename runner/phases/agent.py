"""agent: the chosen agent CLI (``runner.agents``) as a guarded subprocess in the buggy source.

The phase keeps its public name ``codex`` (its marker, its failure labels, the ledgers'
phase columns: the public vocabulary); its result says which agent ran (``agent``).

Invariants, the same for every agent:
- the prompt file's contents go on stdin, never its path as the prompt;
- the agent is given only ``buggy-source/``, never the job root;
- the child's environment is the agent's allowlist and is never logged; its HOME is a
  private scratch directory of the job root, fresh at every start;
- stdout (its JSONL events) and stderr go to private files under ``logs/``, never into
  memory; only counts are read back from them;
- the agent's meter reads its usage as it runs, so a cap (``--max-tokens``,
  ``--max-cost-usd``) stops it between model responses, and a run killed at its deadline
  still has its tokens counted and priced;
- the child runs in its own process group in a PID namespace of its own
  (``runner.containment``), and the whole group is killed at the deadline, on interrupt,
  and after it exits; then every other descendant is found and killed too;
- the runner's files are snapshotted before and restored after; ``buggy-source/`` must
  still be the very directory the agent was given.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog

from reducers.models import CodexResult, Reason
from runner.agents import Agent, Meter, agent_for
from runner.atomic import open_private
from runner.codex_meter import LIVE_USAGE, write_live_usage
from runner.codex_usage import CodexUsage, TokenCounts
from runner.containment.agent import agent_process, hand_over, resolve_agent_user
from runner.containment.descendants import become_subreaper, kill_descendants
from runner.context import JobContext, sha256_file
from runner.errors import AgentNotContainedError, PhaseError
from runner.phases.prepare import read_prompt
from runner.pricing import RateCard, load_rate_card, price
from runner.containment.runner_files import RunnerFilesSnapshot, same_file

log = structlog.get_logger(__name__)

METER_SECONDS = 0.25  # how often the meter reads the agent's usage while it runs


def _fresh_home(path: Path) -> Path:
    """The agent's HOME: empty at every start, so nothing of an earlier run or of the operator runs."""
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


def _wait_metered(
    child: subprocess.Popen[bytes], meter: Meter, spending: _Spending, timeout: float, log_name: str,
) -> tuple[int, bool]:
    """Wait for the agent, reading its usage; kill its group at the deadline or a cap. (exit code, timed out)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return child.wait(timeout=max(min(METER_SECONDS, deadline - time.monotonic()), 0.001)), False
        except subprocess.TimeoutExpired:
            pass
        if spending.saw(meter.poll()):
            log.warning(f"{log_name}_budget_exceeded", cap=spending.exceeded, total_tokens=spending.seen.total)
            _kill_group(child.pid)
            return child.wait(), False
        if time.monotonic() >= deadline:
            _kill_group(child.pid)
            return child.wait(), True


def _merged(reported: CodexUsage, metered: TokenCounts | None) -> TokenCounts:
    """The counts the agent reported at its end, or the meter's running total when that is larger
    (a run killed at a cap or a deadline reports nothing at its end)."""
    final = reported.tokens_only()
    return metered if metered is not None and metered.total > final.total else final


def _warn_unpriced(card: RateCard, model: str | None, max_cost_usd: float | None) -> None:
    """The cost is unknown; a warning when someone could act on it."""
    if card.rates(model) is None:
        warn = log.warning if model is not None or max_cost_usd is not None else log.info
        warn("model_not_on_rate_card", model=model, cost_known=False,
             cost_cap_enforced=False if max_cost_usd is not None else None,
             hint="name the model (--model) and price it (--rate-card)" if model is None else "price it (--rate-card)")


def agent(ctx: JobContext) -> CodexResult:
    """The chosen agent's one attempt (``settings.agent``), under the runner's guards.

    Raises:
        AgentNotFoundError: its CLI is missing.
        PhaseError: a non-zero exit, the deadline, a broken guard.
    """
    settings, job = ctx.settings, ctx.job
    read_prompt(ctx)  # refuses a missing, empty or placeholder prompt
    chosen: Agent = agent_for(settings.agent)
    path = chosen.binary(settings)
    card = load_rate_card(settings.rate_card)  # a bad card is refused before the agent runs
    stdout_path, stderr_path = job.logs / chosen.stdout_log, job.logs / chosen.stderr_log
    home = _fresh_home(job.agent_home)
    launch = chosen.launch(ctx, path, home)
    model = launch.model
    _warn_unpriced(card, model, settings.max_cost_usd)
    spending = _Spending(card, model, settings.max_tokens, settings.max_cost_usd, job.logs / LIVE_USAGE)
    (job.logs / LIVE_USAGE).unlink(missing_ok=True)
    # the runner writes the live usage itself while the agent runs; only a batch's budget reads it, never a result
    own_logs = frozenset(job.relative(path) for path in (stdout_path, stderr_path, job.logs / LIVE_USAGE))
    if _identity(job.buggy_source) is None:
        raise PhaseError("codex", "codex_replaced_source",
                         "buggy-source/ is not a directory (a link, or gone); move it aside and start over")
    agent_user = resolve_agent_user(settings.agent_user)
    if agent_user is not None:
        hand_over(job.buggy_source, agent_user)  # its tree, and nothing else of the job root
        hand_over(job.agent_home, agent_user)  # and its scratch HOME, outside the tree
        with open_private(job.last_message):  # codex writes its last message there, and nowhere else
            os.chown(job.last_message, agent_user.uid, agent_user.gid)
    source_before = _identity(job.buggy_source)  # the very directory, to find it replaced afterwards
    snapshot = RunnerFilesSnapshot.capture(job.root, skip=own_logs)
    become_subreaper()  # orphans of the agent's commands come to the runner, to be killed
    started = time.monotonic()
    timed_out = False
    name = chosen.log_name
    with job.prompt.open("rb") as prompt_file, open_private(stdout_path) as out, open_private(stderr_path) as err:
        try:
            with agent_process(
                launch.argv,
                journal=ctx.journal,
                run_id=ctx.run_id,
                agent=agent_user,
                stdin=prompt_file,  # a file, not a pipe: the deadline runs from the start, whatever the agent reads
                stdout=out,
                stderr=err,
                cwd=job.buggy_source,
                env=launch.env,
            ) as child:
                log.info(f"{name}_started", pid=child.pid, timeout_seconds=settings.codex_timeout,
                         max_tokens=settings.max_tokens, max_cost_usd=settings.max_cost_usd)
                exit_code, timed_out = _wait_metered(child, launch.meter, spending, settings.codex_timeout, name)
        except AgentNotContainedError as e:
            raise PhaseError("codex", "agent_not_contained", f"{e}; the attempt is not trusted") from e
        finally:
            stragglers = kill_descendants()  # the agent's commands, in groups of their own
            if stragglers:  # the agent's leftover commands: ended as the contract says, not a fault
                log.info(f"{name}_stragglers_killed", count=stragglers)
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
            f"{chosen.name.value} changed {len(tampered)} of the runner's files (first: {sorted(tampered)[0]}); "
            "they were restored or removed and the attempt is not trusted",
            exit_code=exit_code,
            details={"runner_files_touched": len(tampered), "timed_out": timed_out},
        )
    usage = chosen.finish(ctx, stdout_path)
    tokens = _merged(usage, launch.meter.poll())  # with the responses that completed after the last poll
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
        codex_overrides_sha256=launch.overrides_sha256,
        cost_usd=cost,
        cost_known=cost is not None,
        rate_card_sha256=card.sha256,
        budget_exceeded=spending.exceeded is not None,
        budget_reason=spending.exceeded,
        agent=chosen.name.value,
    )
    if result.reason is not Reason.OK:
        what, logs = chosen.name.value, f"logs/{chosen.stdout_log}"
        if timed_out:
            message = (
                f"{what} passed the deadline of {settings.codex_timeout:g}s and was killed with its process group; "
                f"what it was doing is in {logs} and logs/{chosen.stderr_log}"
            )
        elif reason is Reason.CODEX_MODEL_ERROR:
            message = (
                f"the model provider failed ({usage.model_error}), an infrastructure failure, not the agent's; "
                f"{what} exited with {exit_code}; see {logs}"
            )
        else:
            message = f"{what} exited with {exit_code}; see logs/{chosen.stderr_log}"
        raise PhaseError("codex", result.reason, message, exit_code=exit_code, details=result.model_dump())
    return result
