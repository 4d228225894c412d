"""precheck: can this host run the task? The health probe, and the first phase of a run.

Invariants: needs no job root; the layout probe runs in a throwaway labelled
container that is always removed; the report holds no host path or secret.

An image's layout is a fact about its id (an image id names its content): the probe's
answer is kept in the state dir for good per (image id, source dir, scripts), so a batch of
tasks on one image probes it once. Codex's version and its login are facts about the binary
and its home: kept a minute, so a batch's tasks ask codex once (``runner.host_memory``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from contextlib import nullcontext
from pathlib import Path

import docker
import structlog
from docker.errors import DockerException
from pydantic import BaseModel, ConfigDict, Field
from requests.exceptions import RequestException

from reducers.models import Phase, PrecheckResult
from runner.agents import AgentName, agent_for
from runner.codex_config import OPENAI_KEY_VARIABLES, active_provider, operator_home, resolve_codex_home
from runner.context import JobContext
from runner.images import task_image
from runner.docker_utils import (
    connect,
    daemon_gone,
    image_identity,
    managed_container,
    start_and_wait,
)
from runner.errors import CodexNotFoundError, DockerUnavailableError, EnvironmentNotReadyError, UnscorableError
from runner.host_memory import HostMemory
from runner.journal import default_state_dir
from runner.pricing import load_rate_card
from runner.settings import RunnerSettings

log = structlog.get_logger(__name__)

VERSION_TIMEOUT = 30
PROBE_TIMEOUT = 120
# Exit-code bits of the layout probe, so each check gets its own answer from one container.
# As the reference does, the scripts must hold the case branches "apply_patch)" and "test_patched)".
_PROBE_SCRIPT = (
    'rc=0; [ -d "$1" ] || rc=$((rc|1)); '
    '[ -z "$2" ] || grep -q "apply_patch)" "$2" 2>/dev/null || rc=$((rc|2)); '
    '[ -z "$3" ] || grep -q "test_patched)" "$3" 2>/dev/null || rc=$((rc|4)); exit $rc'
)
_PROBE_BITS = {
    "image_has_source_dir": (1, "the buggy-source directory is missing in the image; check --source-dir"),
    "entrypoint_knows_apply_patch": (2, "the apply script has no apply_patch) branch; check --apply-cmd"),
    "entrypoint_knows_test_patched": (4, "the test script has no test_patched) branch; check --test-cmd"),
}
# Only a program name and a version number are taken from `codex --version`: anything else on
# that line (a token a wrapper prints, say) would reach the marker and the report, and a
# secret-looking value there made the public guard refuse every public file of the run.
_VERSION_NAME = re.compile(r"codex[a-z-]{0,10}")
_VERSION_NUMBER = re.compile(r"(?<![\w.+-])\d{1,4}\.\d{1,4}(?:\.\d{1,6})?(?:-[a-z]{1,12}(?:\.?\d{1,4})?)?(?![\w.+-])")
# The reason label each layout failure gives, when the image itself says the tag cannot be scored.
_PROBE_REFUSALS = {
    "image_has_source_dir": "layout_unsupported: no source dir",
    "entrypoint_knows_apply_patch": "layout_unsupported: no apply_patch",
    "entrypoint_knows_test_patched": "layout_unsupported: no test_patched",
}
# What --allow-unscorable may override: not a missing tree, which nothing could extract.
_OVERRIDABLE = frozenset({"entrypoint_knows_apply_patch", "entrypoint_knows_test_patched", "tag_scorable"})
CHECK_NAMES = ("codex_binary", "codex_login", "git_binary", "docker_daemon", "image_present", *_PROBE_BITS, "tag_scorable")
# The same checks with another agent's two in codex's place (runner.agents).
CLAUDE_CODE_CHECK_NAMES = ("claude_code_binary", "claude_code_login", *CHECK_NAMES[2:])
_VERSION_TEXT = re.compile(r"[^A-Za-z0-9 ._+-]")


CODEX_MEMORY_SECONDS = 60.0


class _CodexVersion(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    version: str = Field(max_length=64)


class _LoggedIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    logged_in: bool


def codex_memory(state_dir: Path) -> HostMemory:
    return HostMemory.in_state_dir(state_dir, "codex-checks", max_age=CODEX_MEMORY_SECONDS,
                                   wait_seconds=2 * VERSION_TIMEOUT + 5)


def _file_identity(path: Path) -> list[object] | None:
    """Which file this is now: a binary replaced or an auth file rewritten is another question."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


class Check(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    ok: bool
    detail: str
    refusal: str | None = None  # the reason label, when the failure means the tag cannot be scored


class PrecheckReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    healthy: bool
    checks: list[Check]
    codex_version: str | None = None
    agent: str | None = None  # another agent than codex (runner.agents), and its version
    agent_version: str | None = None
    image_id: str | None = None
    tag_profile: str | None = None
    refusal: str | None = None
    unscorable_override: bool = False

    def first_failure(self) -> Check | None:
        return next((check for check in self.checks if not check.ok), None)


def codex_version(codex_bin: str) -> str:
    """``codex --version``, reduced to a short public-safe string.

    Raises:
        CodexNotFoundError: not on PATH, not executable, or it cannot say its version.
    """
    path = shutil.which(codex_bin)
    if path is None:
        raise CodexNotFoundError(codex_bin)
    try:
        done = subprocess.run(
            [path, "--version"], capture_output=True, timeout=VERSION_TIMEOUT, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CodexNotFoundError(codex_bin) from e
    if done.returncode != 0:
        raise CodexNotFoundError(codex_bin)
    first_line = (done.stdout.decode(errors="replace").strip().splitlines() or [""])[0]
    number = _VERSION_NUMBER.search(first_line)
    if number is None:
        return "unknown"
    words = first_line.split()
    name = words[0] if words and _VERSION_NAME.fullmatch(words[0]) else "codex"
    return f"{name} {number.group(0)}"


def git_problem() -> str | None:
    """The baseline and the patch need the ``git`` binary (GitPython runs it)."""
    if shutil.which("git") is None:
        return "the git binary was not found on PATH; install git (the baseline and the patch need it)"
    return None


def codex_login(
    codex_bin: str, codex_home: Path | None, profile: str | None = None, config: tuple[str, ...] = (),
    memory: HostMemory | None = None,
) -> Check:
    """Can codex reach its model? Else it would retry until the deadline, an hour by default.

    A provider whose active config names a key variable (``env_key``) needs that variable;
    otherwise ``codex login status`` must say logged in, or a key variable codex reads be set.
    Only names are reported, never a value, and never codex's own output. A worker asks it
    with no profile or config (those are each task's): the default provider's login.
    """
    home = resolve_codex_home(codex_home, os.environ, operator_home())
    provider = active_provider(home, profile, config)
    if provider.env_key is not None:
        ok = bool(os.environ.get(provider.env_key))
        state = "is set" if ok else "is not set"
        return Check(
            name="codex_login", ok=ok,
            detail=f"the provider key variable {provider.env_key} {state} "
            f"(provider {_VERSION_TEXT.sub('', provider.name)[:40]})",
        )
    path = shutil.which(codex_bin)
    if path is None:
        return Check(name="codex_login", ok=False, detail="not checked: codex is missing")
    # Only "logged in" is remembered (a minute, for this binary, home, auth file and config):
    # after `codex login` a run must not be refused on a stale "no".
    question = HostMemory.question("codex-login", _file_identity(Path(path)), str(home),
                                   _file_identity(home / "auth.json"), list(config),
                                   sorted(name for name in OPENAI_KEY_VARIABLES if os.environ.get(name)))
    with memory.turn(question) if memory is not None else nullcontext():
        logged_in = memory is not None and memory.recall(question, _LoggedIn) is not None
        if not logged_in:
            logged_in = _login_status(path, home, config)
            if logged_in and memory is not None:
                memory.remember(question, _LoggedIn(logged_in=True))
    if logged_in:
        return Check(name="codex_login", ok=True, detail="codex login status: logged in")
    variable = next((name for name in OPENAI_KEY_VARIABLES if os.environ.get(name)), None)
    if variable is not None:
        return Check(name="codex_login", ok=True, detail=f"not logged in, but {variable} is set")
    where = "CODEX_HOME" if home.is_dir() else "CODEX_HOME (it does not exist)"
    return Check(
        name="codex_login", ok=False,
        detail=f"codex is not logged in: run `codex login` (for {where}, or pass --codex-home), "
        f"or set {' or '.join(OPENAI_KEY_VARIABLES)}",
    )


def _login_status(path: str, home: Path, config: tuple[str, ...]) -> bool:
    from runner.agents.codex import child_environment  # the same environment codex gets

    environment = child_environment(os.environ, codex_home=home if home.is_dir() else None)
    try:
        done = subprocess.run(
            # no --profile: codex 0.171.0 takes it for runtime commands only, not `login`
            [path, *[arg for item in config for arg in ("-c", item)], "login", "status"],
            capture_output=True, timeout=VERSION_TIMEOUT, stdin=subprocess.DEVNULL, env=environment,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _remembered_version(codex_bin: str, memory: HostMemory | None) -> str:
    """``codex_version``, asked once a minute per binary when there is a memory.

    Raises:
        CodexNotFoundError: as ``codex_version``.
    """
    path = shutil.which(codex_bin)
    if memory is None or path is None:
        return codex_version(codex_bin)
    question = HostMemory.question("codex-version", _file_identity(Path(path)))
    with memory.turn(question):
        remembered = memory.recall(question, _CodexVersion)
        if remembered is not None:
            return remembered.version
        version = codex_version(codex_bin)
        memory.remember(question, _CodexVersion(version=version))
        return version


def host_checks(
    codex_bin: str, codex_home: Path | None, profile: str | None = None, config: tuple[str, ...] = (),
    memory: HostMemory | None = None,
) -> tuple[list[Check], str | None]:
    """The checks of the host itself, which a precheck and a worker both make: codex found (and
    its version), codex logged in, git found. Returns (checks, codex's version or None).

    ``memory``: where a task's precheck finds what a task of a minute ago found out (a worker's
    own health checks ask afresh each time)."""
    checks: list[Check] = []
    version: str | None = None
    try:
        version = _remembered_version(codex_bin, memory)
        checks.append(Check(name="codex_binary", ok=True, detail=f"found, version {version}"))
    except CodexNotFoundError as e:
        checks.append(Check(name="codex_binary", ok=False, detail=str(e)))
    checks.append(codex_login(codex_bin, codex_home, profile, config, memory))
    missing_git = git_problem()
    checks.append(Check(name="git_binary", ok=missing_git is None, detail=missing_git or "found"))
    return checks, version


def agent_host_checks(settings: RunnerSettings, memory: HostMemory | None = None) -> tuple[list[Check], str | None]:
    """``host_checks`` for the agent ``settings`` names: codex's own, or another agent's binary and login."""
    if settings.agent is AgentName.CODEX:
        return host_checks(settings.codex_bin, settings.codex_home, settings.codex_profile, settings.codex_config,
                           memory)
    chosen = agent_for(settings.agent)
    prefix = chosen.log_name
    checks: list[Check] = []
    version: str | None = None
    try:
        version = chosen.version(settings)
        checks.append(Check(name=f"{prefix}_binary", ok=True, detail=f"found, version {version}"))
    except EnvironmentNotReadyError as e:
        checks.append(Check(name=f"{prefix}_binary", ok=False, detail=str(e)))
    checks.append(chosen.login(settings, memory))
    missing_git = git_problem()
    checks.append(Check(name="git_binary", ok=missing_git is None, detail=missing_git or "found"))
    return checks, version


def script_calling(command: str, subcommand: str) -> str | None:
    """The script a command runs ``subcommand`` with (``... script.sh test_patched``), if it does.

    A custom command that never calls the entry script's subcommand has nothing to probe.
    """
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for before, word in zip(words, words[1:]):
        if word.rstrip(";") == subcommand:
            return before
    return None


class _Layout(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    bits: int = Field(ge=0, le=7)  # the probe's exit code: which of _PROBE_BITS failed


def _probe_layout(
    client: docker.DockerClient, settings: RunnerSettings, image_id: str, labels: dict[str, str]
) -> int:
    apply_script = script_calling(settings.apply_cmd, "apply_patch") or ""
    test_script = script_calling(settings.test_cmd, "test_patched") or ""
    memory = HostMemory.in_state_dir(settings.state_dir or default_state_dir(), "layout-probes", max_age=None,
                                     wait_seconds=PROBE_TIMEOUT + 10)
    question = HostMemory.question("layout", image_id, settings.source_dir, apply_script, test_script)
    with memory.turn(question):
        remembered = memory.recall(question, _Layout)
        if remembered is not None:
            log.info("layout_probe_remembered", bits=remembered.bits)
            return remembered.bits
        with managed_container(
            client,
            image=image_id,
            labels=labels,
            entrypoint=["/bin/sh", "-c", _PROBE_SCRIPT, "probe", settings.source_dir, apply_script, test_script],
            command=[],
            network_disabled=True,
        ) as container:
            bits = start_and_wait(container, timeout=PROBE_TIMEOUT)
        if 0 <= bits <= 7:  # the script's own answer, not a shell that could not run it
            memory.remember(question, _Layout(bits=bits))
        return bits


def _docker_checks(
    client: docker.DockerClient, settings: RunnerSettings, labels: dict[str, str]
) -> tuple[list[Check], str | None]:
    """image_present, then the layout checks; each failure lands under its own check."""
    try:
        image = task_image(client, settings)
    except EnvironmentNotReadyError as e:  # missing, or the allowed pull failed
        return [Check(name="image_present", ok=False, detail=str(e))], None
    image_id, _digest = image_identity(image)
    checks = [Check(name="image_present", ok=True, detail=f"{settings.resolved_image} present")]
    try:
        bits = _probe_layout(client, settings, image_id, labels)
    except (DockerException, RequestException) as e:
        if daemon_gone(e):
            raise
        detail = f"the layout probe container failed ({type(e).__name__}); see the Docker daemon's log"
        return checks + [Check(name=name, ok=False, detail=detail) for name in _PROBE_BITS], image_id
    unprobed = {
        "entrypoint_knows_apply_patch": script_calling(settings.apply_cmd, "apply_patch") is None,
        "entrypoint_knows_test_patched": script_calling(settings.test_cmd, "test_patched") is None,
    }
    for name, (bit, problem) in _PROBE_BITS.items():
        ok = not bits & bit
        detail = "not probed: the command calls no entry script subcommand" if unprobed.get(name) else "yes"
        checks.append(Check(name=name, ok=ok, detail=detail if ok else problem,
                            refusal=None if ok else _PROBE_REFUSALS[name]))
    return checks, image_id


def layout_refusal(
    client: docker.DockerClient, settings: RunnerSettings, image_id: str, labels: dict[str, str]
) -> str | None:
    """The reason label when the image's layout cannot be evaluated with ``settings``, else None."""
    bits = _probe_layout(client, settings, image_id, labels)
    return next((_PROBE_REFUSALS[name] for name, (bit, _) in _PROBE_BITS.items() if bits & bit), None)


def _scorable_check(settings: RunnerSettings) -> Check:
    """Does the tag's profile say it cannot be scored at all (whatever the image holds)?"""
    profile = settings.profile
    if profile is None:
        return Check(name="tag_scorable", ok=True, detail="no profile for this tag: the runner's defaults")
    refusal = profile.refusal
    if refusal is None:
        return Check(name="tag_scorable", ok=True, detail=f"profile {profile.name}: scorable")
    return Check(
        name="tag_scorable",
        ok=False,
        detail=f"profile {profile.name}: cannot be scored ({refusal}); pass --allow-unscorable to evaluate it anyway",
        refusal=refusal,
    )


def _apply_override(checks: list[Check], allow: bool) -> tuple[list[Check], str | None, bool]:
    """(checks, first refusal, overridden): --allow-unscorable turns an overridable refusal into a pass."""
    refusal = next((c.refusal for c in checks if not c.ok and c.refusal), None)
    if not allow or refusal is None:
        return checks, refusal, False
    out = [
        Check(name=c.name, ok=True, detail=f"overridden by --allow-unscorable: {c.refusal}", refusal=c.refusal)
        if not c.ok and c.refusal and c.name in _OVERRIDABLE else c
        for c in checks
    ]
    return out, refusal, True


def run_precheck(
    settings: RunnerSettings, *, labels: dict[str, str], client: docker.DockerClient | None = None
) -> PrecheckReport:
    """Every check, each with its own answer; never raises for an unhealthy host.

    ``client``: the caller's Docker client, when it has one; otherwise one is made and closed.
    """
    image_id: str | None = None
    checks, version = agent_host_checks(settings, codex_memory(settings.state_dir or default_state_dir()))
    own_client = client is None
    try:
        if client is None:
            client = connect()
        checks.append(Check(name="docker_daemon", ok=True, detail="the daemon answers"))
        try:
            docker_checks, image_id = _docker_checks(client, settings, labels)
        except Exception as e:  # it answered the ping, then stopped: the same unhealthy daemon
            if not daemon_gone(e):
                raise
            checks.pop()
            raise DockerUnavailableError(f"it stopped answering: {type(e).__name__}") from e
        checks += docker_checks
    except DockerUnavailableError as e:
        checks.append(Check(name="docker_daemon", ok=False, detail=str(e)))
    finally:
        if own_client and client is not None:
            client.close()
    checks.append(_scorable_check(settings))
    checks, refusal, overridden = _apply_override(checks, settings.allow_unscorable)
    names = CHECK_NAMES if settings.agent is AgentName.CODEX else CLAUDE_CODE_CHECK_NAMES
    healthy = all(check.ok for check in checks) and [c.name for c in checks] == list(names)
    profile = settings.profile
    codex = settings.agent is AgentName.CODEX
    return PrecheckReport(
        healthy=healthy, checks=checks, codex_version=version if codex else None,
        agent=None if codex else settings.agent.value, agent_version=None if codex else version, image_id=image_id,
        tag_profile=profile.name if profile else None, refusal=refusal, unscorable_override=overridden,
    )


def precheck(ctx: JobContext) -> PrecheckResult:
    """The run's precheck phase: the same checks, and the first failure raised.

    Raises:
        EnvironmentNotReadyError: with the failed check's actionable message.
        BadInputError: the operator's rate card is not one (refused before any container).
    """
    load_rate_card(ctx.settings.rate_card)
    try:
        client = ctx.docker()
    except DockerUnavailableError:
        client = None  # reported by the docker_daemon check, with the others
    report = run_precheck(ctx.settings, labels=ctx.labels(Phase.PRECHECK), client=client)
    failed = report.first_failure()
    if failed is not None and failed.refusal:
        raise UnscorableError(failed.detail, reason=f"precheck_{failed.name}", refusal=failed.refusal,
                              tag_profile=report.tag_profile)
    if failed is not None:
        raise EnvironmentNotReadyError(failed.detail, reason=f"precheck_{failed.name}")
    return PrecheckResult(
        codex_version=report.codex_version, agent=report.agent, agent_version=report.agent_version,
        image_id=report.image_id, checks_passed=len(report.checks),
        tag_profile=report.tag_profile, refusal=report.refusal, unscorable_override=report.unscorable_override,
    )
