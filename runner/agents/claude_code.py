"""Claude Code behind the agent seam: ``claude -p --output-format stream-json`` in the buggy source.

Invariants (measured against Claude Code 2.1.197):
- its permissions are the runner's alone: the settings go on the command line (``--settings``
  with the runner's JSON, ``--permission-mode dontAsk``, ``--allowedTools`` and
  ``--disallowedTools``), no settings file is loaded (``--setting-sources ""``: not the
  operator's, not the task repository's ``.claude/``), no MCP server (``--strict-mcp-config``),
  no hook, no slash command; its HOME and ``CLAUDE_CONFIG_DIR`` are the phase's fresh private
  scratch directory; a host with managed settings (``/etc/claude-code``), which would
  outrank the runner's, is refused;
- it runs inside bubblewrap (``--bwrap-bin``, else ``bwrap`` on PATH, else the one the Codex
  CLI ships: Debian's bubblewrap on PATH breaks codex 0.171's own sandbox on this kind of
  host, so a host running both agents need not install it): the whole filesystem read-only, a private empty ``/tmp``, and
  only ``buggy-source/`` and its scratch HOME writable, its own PID namespace and ``/proc``, so neither the job root nor the
  host's ``/tmp`` can be written by it or by any command it runs (its own sandbox is not
  used: as root it confines no write, and its masks litter the work tree);
- the provider key (``ANTHROPIC_API_KEY`` or ``ANTHROPIC_AUTH_TOKEN``) is in its
  environment, never in its commands': each command starts in ``claude_shell.sh``
  (``CLAUDE_CODE_SHELL_PREFIX``), which drops it;
- its commands have no network: the prefix runs each in a network namespace of its own (a
  user namespace mapping the same user, so root and ``--agent-user`` alike), while ``claude``
  keeps the host's to reach its model; a host where none can be made fails the login check,
  and the prefix runs no command without one (fail closed);
- its usage is read from its own event stream as it grows: each ``assistant`` message's
  usage (by message id), then the ``result`` event's exact totals; Anthropic's counts are
  disjoint (input, cache read, cache write, output), priced as ``usage = "disjoint"``;
- its last message is the ``result`` event's text, written by the runner to ``job.last_message``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.agents import AgentName, CliAgent, Launch
from runner.agents.codex import allowed_environment
from runner.atomic import write_bytes_atomic
from runner.codex_meter import LineMeter
from runner.codex_usage import MAX_TOKENS, CodexUsage, TokenCounts, count_of, error_class
from runner.errors import ClaudeCodeNotFoundError, EnvironmentNotReadyError

if TYPE_CHECKING:
    from runner.context import JobContext
    from runner.host_memory import HostMemory
    from runner.phases.precheck import Check
    from runner.settings import RunnerSettings

STDOUT_LOG = "claude-code.stdout.log"
STDERR_LOG = "claude-code.stderr.log"
CONFIG_DIR = ".claude"  # CLAUDE_CONFIG_DIR, in the agent's scratch HOME
KEY_VARIABLES = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
# What Claude Code needs to run and reach its provider; everything else of the host stays out.
ENV_ALLOWLIST = frozenset(
    {
        "PATH", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "LOGNAME", *KEY_VARIABLES, "ANTHROPIC_BASE_URL",
        "SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY",
        "https_proxy", "http_proxy", "no_proxy", "CLAUDE_CODE_MAX_RETRIES", "API_TIMEOUT_MS",
    }
)
# Set by the runner, whatever the operator's environment says.
FIXED_ENVIRONMENT = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}
ALLOWED_TOOLS = ("Bash", "Read", "Edit", "MultiEdit", "Write", "Glob", "Grep", "LS", "TodoWrite", "NotebookEdit")
DISALLOWED_TOOLS = ("WebFetch", "WebSearch")
# The runner's settings, the only ones loaded; nothing of the operator's or the task's can add to them.
RUNNER_SETTINGS: dict[str, Any] = {
    "permissions": {
        "allow": list(ALLOWED_TOOLS), "deny": list(DISALLOWED_TOOLS), "defaultMode": "dontAsk",
        "disableBypassPermissionsMode": "disable",
    },
    "disableAllHooks": True,
    "enableAllProjectMcpServers": False,
    "includeCoAuthoredBy": False,
}
MANAGED_SETTINGS = Path("/etc/claude-code")
SHELL_PREFIX = Path(__file__).with_name("claude_shell.sh")
VERSION_TIMEOUT = 30
_VERSION_NUMBER = re.compile(r"\d{1,4}\.\d{1,4}\.\d{1,6}")


def bwrap_path(settings: RunnerSettings) -> str | None:
    """The bubblewrap that confines Claude Code: the operator's, the host's, or codex's own (None: none)."""
    if settings.bwrap_bin is not None:
        found = shutil.which(settings.bwrap_bin)
        return os.path.abspath(found) if found else None
    found = shutil.which("bwrap")
    if found:
        return found
    for name in dict.fromkeys((settings.codex_bin, "codex")):
        codex = shutil.which(name)
        if codex is None:
            continue
        package = Path(os.path.realpath(codex)).parent.parent  # .../@openai/codex/bin/codex.js
        vendored = sorted(package.glob("node_modules/@openai/codex-*/vendor/*/codex-resources/bwrap"))
        if vendored and os.access(vendored[0], os.X_OK):
            return str(vendored[0])
    return None


MISSING_BWRAP = ("bubblewrap was not found (--bwrap-bin, bwrap on PATH, or the Codex CLI's own): the runner "
                 "confines Claude Code with it; install @openai/codex or pass --bwrap-bin")


def claude_argv(claude_path: str, *, model: str | None = None) -> list[str]:
    """Claude Code's own argv; the runner's settings and permissions, nothing the operator can widen."""
    return [
        claude_path, "-p",
        "--output-format", "stream-json", "--verbose",
        "--settings", json.dumps(RUNNER_SETTINGS, sort_keys=True),
        "--setting-sources", "",
        "--strict-mcp-config",
        "--disable-slash-commands",
        "--permission-mode", "dontAsk",
        "--allowedTools", ",".join(ALLOWED_TOOLS),
        "--disallowedTools", ",".join(DISALLOWED_TOOLS),
        *(["--model", model] if model else []),
    ]


def confined(argv: list[str], bwrap: str, writable: tuple[Path, ...]) -> list[str]:
    """``argv`` inside bubblewrap: everything read-only, a private ``/tmp``, ``writable`` writable.

    The shell prefix is bound in again read-only after the private ``/tmp``: the runner may be
    installed (or cloned) under ``/tmp``, and every command the agent runs starts in that script.
    A PID namespace of its own and its own ``/proc``: the host's ``/proc``, bound read-only with
    ``/``, would refuse the user namespace in which the prefix takes each command's network away."""
    binds = [arg for path in writable for arg in ("--bind", str(path), str(path))]
    return [bwrap, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--unshare-pid", "--proc", "/proc",
            "--tmpfs", "/tmp", "--ro-bind", str(SHELL_PREFIX), str(SHELL_PREFIX), *binds, "--die-with-parent",
            "--", *argv]


NO_NETWORK_NAMESPACE = ("no network namespace can be made inside Claude Code's bubblewrap on this host (the runner "
                        "runs each of the agent's commands in one, without network, and runs none without it); "
                        "allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0, no AppArmor "
                        "restriction on them) or run Claude Code attempts on another host")


def network_off_problem(settings: RunnerSettings, bwrap: str) -> str | None:
    """Can the shell prefix take a command's network away here, as the agent will run? None: yes.

    The prefix itself, run once in the same bubblewrap (as ``--agent-user`` when set), with a
    command that must find no interface but the loopback: the check cannot pass where the commands would
    run with network, and every real command would be refused the same way."""
    from runner.containment.agent import resolve_agent_user, wrap
    from runner.errors import BadInputError

    try:
        user = resolve_agent_user(settings.agent_user)
    except BadInputError:
        user = None  # reported by the precheck's own --agent-user check
    probe = "[ \"$(grep -c : /proc/net/dev)\" = 1 ] && grep -q '^ *lo:' /proc/net/dev"  # only a loopback
    try:
        done = subprocess.run(wrap(confined([str(SHELL_PREFIX), probe], bwrap, ()), user), capture_output=True,
                              timeout=VERSION_TIMEOUT, stdin=subprocess.DEVNULL, env={"PATH": os.defpath})
    except (OSError, subprocess.TimeoutExpired):
        return NO_NETWORK_NAMESPACE
    return None if done.returncode == 0 else NO_NETWORK_NAMESPACE


def child_environment(environ: dict[str, str] | os._Environ[str], home: Path) -> dict[str, str]:
    """The allowlist, the runner's fixed variables, its private HOME and config dir, and the shell prefix."""
    if any(c.isspace() for c in str(SHELL_PREFIX)) or not os.access(SHELL_PREFIX, os.X_OK):
        raise EnvironmentNotReadyError("runner/agents/claude_shell.sh is not an executable file on a path without "
                                       "spaces; Claude Code's shell prefix cannot run it", reason="bad_environment")
    return {
        **allowed_environment(environ, ENV_ALLOWLIST),
        **FIXED_ENVIRONMENT,
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / CONFIG_DIR),
        "CLAUDE_CODE_SHELL_PREFIX": str(SHELL_PREFIX),
    }


def _counts(usage: Any) -> TokenCounts:
    """An Anthropic usage object as the runner's counts (disjoint: cache reads and writes apart)."""
    if not isinstance(usage, dict):
        return TokenCounts()
    return TokenCounts(
        input_tokens=count_of(usage, "input_tokens"),
        cached_input_tokens=count_of(usage, "cache_read_input_tokens"),
        cache_write_input_tokens=count_of(usage, "cache_creation_input_tokens"),
        output_tokens=count_of(usage, "output_tokens"),
    )


def _sum(counts: list[TokenCounts]) -> TokenCounts:
    fields = ("input_tokens", "cached_input_tokens", "cache_write_input_tokens", "output_tokens")
    return TokenCounts(**{f: min(sum(getattr(c, f) for c in counts), MAX_TOKENS) for f in fields})


class StreamMeter(LineMeter):
    """Claude Code's usage from its ``stream-json`` stdout, read as it grows.

    Before the ``result`` event, the sum over its assistant messages (each message's latest
    usage, by id); after it, the result's own totals, which are exact.
    """

    def __init__(self, stdout: Path) -> None:
        super().__init__()
        self._stdout = stdout
        self._messages: dict[str, TokenCounts] = {}
        self.result: dict[str, Any] | None = None

    def _find(self) -> Path | None:
        return self._stdout if self._stdout.is_file() and not self._stdout.is_symlink() else None

    def _take(self, line: bytes) -> None:
        if b'"assistant"' not in line and b'"result"' not in line:
            return
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            return
        if not isinstance(event, dict):
            return
        if event.get("type") == "assistant" and self.result is None:
            message = event.get("message")
            if isinstance(message, dict) and isinstance(message.get("id"), str):
                self._messages[message["id"][:200]] = _counts(message.get("usage"))
                self.latest = _sum(list(self._messages.values()))
        elif event.get("type") == "result":
            self.result = event
            if isinstance(event.get("usage"), dict):
                self.latest = _counts(event["usage"])

    @property
    def messages(self) -> int:
        return len(self._messages)


def _model_error(result: dict[str, Any] | None) -> str | None:
    """The provider's failure, as a public class (never its message), when the result says one."""
    if result is None or result.get("is_error") is not True:
        return None
    status = result.get("api_error_status")
    if isinstance(status, int) and not isinstance(status, bool):
        return error_class(str(status))
    return None


class ClaudeCodeAgent(CliAgent):
    name = AgentName.CLAUDE_CODE
    log_name = "claude_code"
    bin_setting = "claude_bin"
    missing = ClaudeCodeNotFoundError

    def version(self, settings: RunnerSettings) -> str:
        path = self.binary(settings)
        try:
            done = subprocess.run([path, "--version"], capture_output=True, timeout=VERSION_TIMEOUT,
                                  stdin=subprocess.DEVNULL, env=allowed_environment(os.environ, ENV_ALLOWLIST))
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ClaudeCodeNotFoundError(settings.claude_bin) from e
        if done.returncode != 0:
            raise ClaudeCodeNotFoundError(settings.claude_bin)
        number = _VERSION_NUMBER.search(done.stdout.decode(errors="replace"))
        return f"claude-code {number.group(0)}" if number else "unknown"

    def login(self, settings: RunnerSettings, memory: HostMemory | None = None) -> Check:
        """Its config dir is private to each attempt, so no ``claude login`` of the host is used: the key variable."""
        from runner.phases.precheck import Check

        name = "claude_code_login"
        bwrap = bwrap_path(settings)
        if bwrap is None:
            return Check(name=name, ok=False, detail=MISSING_BWRAP)
        if MANAGED_SETTINGS.exists():
            return Check(name=name, ok=False, detail=f"{MANAGED_SETTINGS} holds managed settings, which would outrank "
                         "the runner's permissions; run Claude Code attempts on a host without them")
        no_network = network_off_problem(settings, bwrap)
        if no_network is not None:
            return Check(name=name, ok=False, detail=no_network)
        variable = next((v for v in KEY_VARIABLES if os.environ.get(v)), None)
        if variable is None:
            return Check(name=name, ok=False, detail=f"set {' or '.join(KEY_VARIABLES)}: each attempt gets a private "
                         "config dir, so a `claude login` of this host is not used")
        return Check(name=name, ok=True, detail=f"{variable} is set")

    def launch(self, ctx: JobContext, path: str, home: Path) -> Launch:
        settings, job = ctx.settings, ctx.job
        bwrap = bwrap_path(settings)
        if bwrap is None:
            raise EnvironmentNotReadyError(MISSING_BWRAP, reason="precheck_claude_code_login")
        if MANAGED_SETTINGS.exists():
            raise EnvironmentNotReadyError(f"{MANAGED_SETTINGS} holds managed settings, which would outrank the "
                                           "runner's permissions", reason="precheck_claude_code_login")
        job.last_message.unlink(missing_ok=True)
        (home / CONFIG_DIR).mkdir(mode=0o700)
        argv = confined(claude_argv(path, model=settings.model), bwrap, (job.buggy_source, home))
        return Launch(argv=argv, env=child_environment(os.environ, home), meter=StreamMeter(job.logs / STDOUT_LOG),
                      model=settings.model)

    def finish(self, ctx: JobContext, stdout: Path) -> CodexUsage:
        transcript = StreamMeter(stdout)
        tokens = transcript.poll() or TokenCounts()
        result = transcript.result
        text = result.get("result") if result is not None else None
        if isinstance(text, str) and text.strip():
            write_bytes_atomic(ctx.job.last_message, text.encode(), mode=0o600)
        model_error = _model_error(result)
        turns = result.get("num_turns") if result is not None else None
        counted = turns if isinstance(turns, int) and not isinstance(turns, bool) and 0 <= turns < 10**6 \
            else transcript.messages
        return CodexUsage(**tokens.__dict__, turns=counted, failed_turns=1 if model_error else 0,
                          model_error=model_error)
