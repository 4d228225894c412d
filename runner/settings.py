"""The settings a run uses, resolved, and the field types every shape of a task shares.

A task's settings come from what the operator said (flags, then the reference
script's environment variables, read once at the driver: ``runner.tasks.spec``),
then its tag's profile, then the defaults here. ``RunnerSettings`` is that
result, built in one place (``runner.tasks.spec.resolve``) and passed down: no
setting is read from the environment after that. The environment is still read
for what is not a setting: the provider key and CODEX_HOME for codex's
allowlisted environment, the secret values the public guard refuses, the state
directory's XDG default, Docker's own variables (through docker-py), the
batch's lifeline and the test session label.

Every value that ends up in a container name, a label, a path or a public file
is validated by the types below, so bad input is refused before any work, by
whichever shape carries it (a spec, a fleet message, the resolved settings).
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

from reducers.models import Frozen
from runner.agents import DEFAULT_AGENT, AgentName
from runner.profiles import TagProfile, profile_for

DEFAULT_TAG = "lagent_239"
IMAGE_REPOSITORY = "alfin06/agentissue-bench"
DEFAULT_SOURCE_DIR = "/app/source_code_buggy"
DEFAULT_APPLY_CMD = "/usr/local/bin/run_test_entrypoint.sh apply_patch /patches/attempt.patch"
DEFAULT_TEST_CMD = "/usr/local/bin/run_test_entrypoint.sh test_patched"
PATCH_IN_CONTAINER = "/patches/attempt.patch"
DEFAULT_CODEX_TIMEOUT = 3600.0
DEFAULT_EVAL_TIMEOUT = 300.0  # as the official evaluation
# Extract and baseline, each its own: a stalled get_archive or a huge tree never holds a host for ever.
DEFAULT_EXTRACT_TIMEOUT = 1800.0
# A pull that reports no progress for this long has stalled (the registry or the network is gone).
DEFAULT_PULL_TIMEOUT = 1800.0

# A task tag is a Docker image tag: it starts with a letter, digit or '_' (so never '.', '-').
SAFE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,119}")
# An image reference: registry/repo path, optional tag, optional digest. No spaces, no shell.
SAFE_IMAGE = re.compile(r"[a-z0-9][a-z0-9._/:-]{0,200}(@sha256:[a-f0-9]{64})?", re.IGNORECASE)
SAFE_CONTAINER_PATH = re.compile(r"/[A-Za-z0-9_.@+/-]{0,250}")
# Host paths the runner creates: no spaces, quotes or shell metacharacters, no '..'.
SAFE_HOST_PATH = re.compile(r"[A-Za-z0-9_.@+/~-]{1,1024}")
# Deadlines: at least a second (a shorter one was silently floored to 1 s), at most a week
# (inf or 1e300 passed and crashed evaluate with OverflowError after codex had run).
MIN_TIMEOUT_SECONDS = 1.0
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600.0
# Codex: a model name, a profile name, and ``-c KEY=VALUE`` overrides with a dotted key.
SAFE_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")
SAFE_PROFILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
CODEX_CONFIG_KEY = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
SAFE_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
DEFAULT_CANARY_BASE_IMAGE = "debian:bookworm-slim"
# What the evaluation's network probe must reach: the public package index the tasks install
# from, unless the operator declares its own (a wheelhouse, a proxy) with --eval-probe.
DEFAULT_PROBE_ENDPOINTS = ("pypi.org:443",)
MAX_PROBE_ENDPOINTS = 8
# HOST:PORT: a DNS name or an IPv4 address, or an IPv6 address in brackets. Nothing else (no
# user@, no scheme, no path): the endpoint is recorded in the compact run.
_PROBE_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*\.?"
                         r"|\[[0-9A-Fa-f:.]{2,45}\]")


class OutputFormat(str, Enum):
    JSON = "json"
    MARKDOWN = "markdown"


class EvalNetwork(str, Enum):
    NONE = "none"
    BRIDGE = "bridge"
    HOST = "host"


# Each setting's environment variable, in this one table: the operator's input is read from
# them (runner.tasks.spec); the supervisor and the tests derive from it which ones a task or a
# test's child must not inherit.
ENV_OF_FIELD: dict[str, str] = {
    "tag": "TAG",
    "image": "IMAGE",
    "codex_bin": "CODEX_BIN",
    "claude_bin": "CLAUDE_BIN",
    "bwrap_bin": "RUNNER_BWRAP_BIN",
    "agent": "RUNNER_AGENT",
    "allow_pull": "ALLOW_DOCKER_PULL",
    "precheck_only": "PRECHECK_ONLY",
    "codex_timeout": "RUNNER_CODEX_TIMEOUT",
    "extract_timeout": "RUNNER_EXTRACT_TIMEOUT",
    "eval_timeout": "RUNNER_EVAL_TIMEOUT",
    "eval_network": "RUNNER_EVAL_NETWORK",
    "source_dir": "CONTAINER_BUGGY_SOURCE",
    "apply_cmd": "PATCH_APPLY_SH",
    "test_cmd": "PATCH_TEST_SH",
    "output_format": "RUNNER_FORMAT",
    "job_root": "JOB_ROOT",
    "state_dir": "RUNNER_STATE_DIR",
    "cache_dir": "RUNNER_CACHE_DIR",
    "cache_max_gb": "RUNNER_CACHE_MAX_GB",
    "agent_user": "RUNNER_AGENT_USER",
    "model": "RUNNER_MODEL",
    "codex_profile": "RUNNER_CODEX_PROFILE",
    "codex_home": "CODEX_HOME",
    "canary_base_image": "RUNNER_CANARY_BASE_IMAGE",
    "allow_unscorable": "RUNNER_ALLOW_UNSCORABLE",
    "eval_probe": "RUNNER_EVAL_PROBE",  # comma-separated HOST:PORT
    "max_tokens": "RUNNER_MAX_TOKENS",
    "max_cost_usd": "RUNNER_MAX_COST_USD",
    "rate_card": "RUNNER_RATE_CARD",
    "image_repository": "RUNNER_IMAGE_REPOSITORY",
    "pull_timeout": "RUNNER_PULL_TIMEOUT",
}
# The reference script's own variables (they keep their names here).
REFERENCE_ENV = frozenset(ENV_OF_FIELD[field] for field in (
    "tag", "image", "codex_bin", "allow_pull", "precheck_only", "source_dir", "apply_cmd", "test_cmd", "job_root",
))
# Those that name one task or one call: a supervisor's task gets its own in its request instead.
TASK_ENV = frozenset(ENV_OF_FIELD[field] for field in ("tag", "image", "job_root", "precheck_only"))


def is_safe_tag(tag: str) -> bool:
    """A tag the runner takes (a Docker tag, no path tricks): specs, a tags file, submit, the worker."""
    return bool(SAFE_TAG.fullmatch(tag)) and ".." not in tag


# -- the field types: one rule each, whatever model carries the value ------------------------


def _tag(value: str) -> str:
    if not is_safe_tag(value):
        raise ValueError(
            "must be 1-120 letters, digits, '_', '.' or '-', starting with a letter, digit or '_', without '..'"
        )
    return value


def _image(value: str) -> str:
    if not SAFE_IMAGE.fullmatch(value) or ".." in value:
        raise ValueError("must be a plain image reference (registry/repository:tag or @sha256:...)")
    return value


def _image_repository(value: str) -> str:
    """A repository without its tag (``alfin06/agentissue-bench``, ``127.0.0.1:5000/mirror/agentissue``)."""
    last = value.rsplit("/", 1)[-1]
    if not SAFE_IMAGE.fullmatch(value) or ".." in value or "@" in value or ":" in last or value.endswith("/"):
        raise ValueError("must be an image repository without a tag (registry/repository, e.g. "
                         "alfin06/agentissue-bench or 127.0.0.1:5000/agentissue-bench)")
    return value


def _container_path(value: str) -> str:
    if not SAFE_CONTAINER_PATH.fullmatch(value) or ".." in value.split("/") or value == "/":
        raise ValueError("must be an absolute path inside the image, without '..' or spaces")
    return value.rstrip("/")


def _host_path(value: Path) -> Path:
    if not SAFE_HOST_PATH.fullmatch(str(value)) or ".." in value.parts:
        raise ValueError("must be a path of letters, digits and '_ . @ + / ~ -', without '..' or spaces")
    return value


def _shell_line(value: str) -> str:
    if not value.strip() or len(value) > 2000 or any(c in value for c in "\n\r\0"):
        raise ValueError("must be one non-empty line of shell")
    return value


def _command_name(value: str) -> str:
    if not value or len(value) > 4096 or any(c in value for c in "\n\r\0"):
        raise ValueError("must be a command name or a path")
    return value


def _user(value: str) -> str:
    if not SAFE_USER.fullmatch(value):
        raise ValueError("must be a user name (lower-case letters, digits, '_' or '-')")
    return value


def _model(value: str) -> str:
    if not SAFE_MODEL.fullmatch(value):
        raise ValueError("must be 1-128 letters, digits and '. _ : / @ + -'")
    return value


def _profile(value: str) -> str:
    if not SAFE_PROFILE.fullmatch(value) or ".." in value:
        raise ValueError("must be 1-64 letters, digits, '_', '.' or '-'")
    return value


def _codex_overrides(value: tuple[str, ...]) -> tuple[str, ...]:
    from runner.codex_config import check_override  # codex's own rules live beside the guards

    for item in value:
        check_override(item)
    return value


def _patch_patterns(value: tuple[str, ...]) -> tuple[str, ...]:
    from runner.hygiene import check_pattern

    for item in value:
        check_pattern(item)
    return value


def _endpoint_list(value: object) -> object:
    """The environment's form, ``HOST:PORT,HOST:PORT``, as the flags' list."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


def _probe_endpoints(value: tuple[str, ...]) -> tuple[str, ...]:
    if len(value) > MAX_PROBE_ENDPOINTS:
        raise ValueError(f"at most {MAX_PROBE_ENDPOINTS} endpoints")
    normal = []
    for item in value:
        host, sep, port = item.rpartition(":")
        if not sep or len(host) > 253 or not _PROBE_HOST.fullmatch(host) or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError("must be HOST:PORT (a host name, an IPv4 address or [an IPv6 address], "
                             "and a port from 1 to 65535)")
        normal.append(f"{host.lower().rstrip('.')}:{int(port)}")
    return tuple(dict.fromkeys(normal))


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """(host, port) of a validated endpoint; an IPv6 host loses its brackets (bash's /dev/tcp takes it bare)."""
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


Tag = Annotated[str, AfterValidator(_tag)]
ImageRef = Annotated[str, AfterValidator(_image)]
ImageRepository = Annotated[str, AfterValidator(_image_repository)]
ContainerPath = Annotated[str, AfterValidator(_container_path)]
HostPath = Annotated[Path, AfterValidator(_host_path)]
ShellLine = Annotated[str, AfterValidator(_shell_line)]
CommandName = Annotated[str, AfterValidator(_command_name)]
UserName = Annotated[str, AfterValidator(_user)]
ModelName = Annotated[str, AfterValidator(_model)]
ProfileName = Annotated[str, AfterValidator(_profile)]
CodexOverrides = Annotated[tuple[str, ...], AfterValidator(_codex_overrides)]
PatchPatterns = Annotated[tuple[str, ...], AfterValidator(_patch_patterns)]
ProbeEndpoints = Annotated[tuple[str, ...], BeforeValidator(_endpoint_list), AfterValidator(_probe_endpoints)]
Timeout = Annotated[float, Field(ge=MIN_TIMEOUT_SECONDS, le=MAX_TIMEOUT_SECONDS, allow_inf_nan=False)]
CacheGigabytes = Annotated[float, Field(ge=0, le=1_000_000, allow_inf_nan=False)]
# Caps on one attempt's spending, enforced while codex runs (runner.codex_meter).
TokenCap = Annotated[int, Field(ge=1, le=10**12)]
DollarCap = Annotated[float, Field(gt=0, le=1_000_000, allow_inf_nan=False)]


class RunnerSettings(Frozen):
    """One run's settings, resolved: the operator's, then the tag's profile, then the defaults.

    Built by ``runner.tasks.spec.resolve`` (or its ``load_settings``) only; every phase reads these.
    """

    tag: Tag = DEFAULT_TAG
    image: ImageRef | None = None
    # Where a tag's image lives when neither --image nor its profile names one: REPO:<tag> (None: IMAGE_REPOSITORY).
    image_repository: ImageRepository | None = None
    # The image the name resolved to when its batch or submit started (name@sha256:..., or an image id):
    # every phase uses it, so a push to the same tag while the suite runs changes nothing evaluated.
    image_pin: ImageRef | None = None
    # The agent that makes the attempt (runner.agents): codex, or claude-code.
    agent: AgentName = DEFAULT_AGENT
    codex_bin: CommandName = "codex"
    claude_bin: CommandName = "claude"
    bwrap_bin: CommandName | None = None  # what confines Claude Code (None: bwrap on PATH, else codex's own)
    allow_pull: bool = False
    pull_timeout: Timeout = DEFAULT_PULL_TIMEOUT
    precheck_only: bool = False
    codex_timeout: Timeout = DEFAULT_CODEX_TIMEOUT
    # The deadline of extract, and again (its own) of baseline.
    extract_timeout: Timeout = DEFAULT_EXTRACT_TIMEOUT
    eval_timeout: Timeout = DEFAULT_EVAL_TIMEOUT
    eval_network: EvalNetwork = EvalNetwork.BRIDGE
    source_dir: ContainerPath = DEFAULT_SOURCE_DIR
    apply_cmd: ShellLine = DEFAULT_APPLY_CMD
    test_cmd: ShellLine = DEFAULT_TEST_CMD
    output_format: OutputFormat = OutputFormat.JSON
    job_root: HostPath | None = None
    # Where the runner keeps its own record of each job root, outside every job root.
    state_dir: Path | None = None
    # The extraction cache (host-wide, outside every job root): where, and how large at most (0: off).
    cache_dir: HostPath | None = None
    cache_max_gb: CacheGigabytes = 20.0
    # An unprivileged user the agent runs as (the runner must be root): it can write only buggy-source/.
    agent_user: UserName | None = None
    model: ModelName | None = None
    codex_profile: ProfileName | None = None
    codex_config: CodexOverrides = ()
    codex_home: Path | None = None
    patch_exclude: PatchPatterns = ()
    canary_base_image: ImageRef = DEFAULT_CANARY_BASE_IMAGE
    # Evaluate a tag that precheck would refuse as unscorable; recorded in the compact run.
    allow_unscorable: bool = False
    # What the evaluation's network probe must reach (empty: the package index, DEFAULT_PROBE_ENDPOINTS).
    eval_probe: ProbeEndpoints = ()
    # Per-attempt caps, live: codex is stopped when its usage crosses one; the attempt is still scored.
    max_tokens: TokenCap | None = None
    max_cost_usd: DollarCap | None = None
    # The operator's rate card (None: the shipped runner/data/rate_card.toml).
    rate_card: HostPath | None = None
    # The settings the tag's profile supplied (the operator gave none), for the plan to show.
    profile_fields: tuple[str, ...] = ()

    @property
    def image_name(self) -> str:
        """The image as named (the operator's, the profile's, else REPO:<tag>): what the compact run shows."""
        return self.image or f"{self.image_repository or IMAGE_REPOSITORY}:{self.tag}"

    @property
    def resolved_image(self) -> str:
        """The image every phase uses: the pinned one where the driver pinned it, else the name."""
        return self.image_pin or self.image_name

    @property
    def probe_endpoints(self) -> tuple[str, ...]:
        return self.eval_probe or DEFAULT_PROBE_ENDPOINTS

    @property
    def profile(self) -> TagProfile | None:
        return profile_for(self.tag)

