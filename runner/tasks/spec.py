"""What a task is (``TaskSpec``), what the host running it has (``HostSettings``), and the one
place a task's tag profile is applied (``resolve``).

A spec holds what the operator said about the task and nothing it did not say: a
setting left unsaid is ``None`` and travels as ``None`` (to a task process, through
the fleet's queue), so that the task's own process fills it from its own tag's
profile, then the defaults. Every driver builds its specs with ``read_operator``
(flags, then the environment, read once, in the operator's process) and every task
process turns its spec into settings with ``resolve``: a single run, a batch and a
worker cannot disagree on what a tag's evaluation command, network or deadline is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from reducers.models import Frozen
from runner.agents import AgentName
from runner.errors import BadInputError
from runner.settings import (
    SAFE_HOST_PATH,
    DEFAULT_CANARY_BASE_IMAGE,
    DEFAULT_PULL_TIMEOUT,
    DEFAULT_TAG,
    ENV_OF_FIELD,
    CacheGigabytes,
    CodexOverrides,
    CommandName,
    DollarCap,
    ContainerPath,
    EvalNetwork,
    HostPath,
    ImageRef,
    ImageRepository,
    ModelName,
    OutputFormat,
    PatchPatterns,
    ProbeEndpoints,
    ProfileName,
    RunnerSettings,
    ShellLine,
    Tag,
    Timeout,
    TokenCap,
    UserName,
)

# The flags whose name is not the field's (``--eval-timeout`` is ``eval_timeout``).
_FLAG_OF_FIELD = {"output_format": "--format", "precheck_only": "--precheck"}


class TaskSpec(Frozen):
    """One task as the operator gave it: the tag, and each setting it said (``None``: it did not)."""

    tag: Tag
    image: ImageRef | None = None  # None: the tag's profile's image, else the default repository's
    image_repository: ImageRepository | None = None  # the repository of a tag's image (its profile's image tag kept)
    image_pin: ImageRef | None = None  # set by the batch or submit (runner.images.pin_image), never a flag
    agent: AgentName | None = None  # None: codex
    codex_timeout: Timeout | None = None
    extract_timeout: Timeout | None = None
    eval_timeout: Timeout | None = None
    eval_network: EvalNetwork | None = None
    source_dir: ContainerPath | None = None
    apply_cmd: ShellLine | None = None
    test_cmd: ShellLine | None = None
    model: ModelName | None = None
    codex_profile: ProfileName | None = None
    codex_config: CodexOverrides = ()
    patch_exclude: PatchPatterns = ()
    allow_unscorable: bool = False
    eval_probe: ProbeEndpoints = ()  # empty: the package index
    max_tokens: TokenCap | None = None
    max_cost_usd: DollarCap | None = None

    def for_tag(self, tag: str) -> TaskSpec:
        """The same settings for another tag (a batch's, a suite's).

        Raises:
            BadInputError: not a safe tag.
        """
        return build_model(TaskSpec, {**self.model_dump(exclude={"tag"}), "tag": tag}, {"tag": "--tag"})

    def pinned(self, ref: str | None) -> TaskSpec:
        """The same task on the image its driver pinned (``runner.images.pin_image``); None: as it was."""
        return self if ref is None else build_model(TaskSpec, {**self.model_dump(), "image_pin": ref}, {})


class HostSettings(Frozen):
    """What the host running a task has: its codex, its Docker access, its directories."""

    codex_bin: CommandName = "codex"
    claude_bin: CommandName = "claude"
    bwrap_bin: CommandName | None = None
    codex_home: Path | None = None
    allow_pull: bool = False
    pull_timeout: Timeout = DEFAULT_PULL_TIMEOUT
    state_dir: Path | None = None
    cache_dir: HostPath | None = None
    cache_max_gb: CacheGigabytes = 20.0
    agent_user: UserName | None = None
    rate_card: HostPath | None = None


class CallSettings(Frozen):
    """Settings of one CLI call, never of a task: how it prints, which mode, the canary's base."""

    output_format: OutputFormat = OutputFormat.JSON
    precheck_only: bool = False
    canary_base_image: ImageRef = DEFAULT_CANARY_BASE_IMAGE


# Every setting but these three belongs to exactly one of the models above.
PLACEMENT_FIELDS = ("job_root",)  # where a task runs: the driver's to say (a worker's jobs dir)
DERIVED_FIELDS = ("profile_fields",)


@dataclass(frozen=True)
class OperatorInput:
    """What the operator said in one call: the task (for its tag), the host, the call, the job root."""

    spec: TaskSpec
    host: HostSettings
    call: CallSettings
    job_root: Path | None

    def settings(self) -> RunnerSettings:
        """The call's own task resolved here (the plan, the precheck, the canary)."""
        return resolve(self.spec, self.host, job_root=self.job_root, call=self.call)


def _as_typed(field: str, origin: Mapping[str, str]) -> str:
    return origin.get(field) or _FLAG_OF_FIELD.get(field, "--" + field.replace("_", "-"))


def build_model(model: type[BaseModel], values: Mapping[str, Any], origin: Mapping[str, str] | None = None) -> Any:
    """``model`` from ``values``; a refused value is named as the operator typed it (flag or variable)."""
    origin = origin or {}
    try:
        return model(**values)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            message = str(err["msg"]).removeprefix("Value error, ")
            problems.append(f"{_as_typed(field, origin)}: {message}" if field else message)
        raise BadInputError("invalid settings: " + "; ".join(problems)) from e


def read_operator(
    flags: Mapping[str, object],
    environ: Mapping[str, str] | None = None,
    *,
    env_skipped: frozenset[str] = frozenset(),
) -> OperatorInput:
    """Flags (``None``: not given), then each setting's environment variable (``ENV_OF_FIELD``).

    ``env_skipped``: fields whose variable this call must not read (a batch's TAG and IMAGE).

    Raises:
        BadInputError: naming the flag or variable that is wrong, as typed.
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for field, value in flags.items():
        if value is not None:
            values[field] = value
    for field, variable in ENV_OF_FIELD.items():
        if field not in values and field not in env_skipped and environ.get(variable):
            values[field], origin[field] = environ[variable], variable
    unknown = set(values) - set(TaskSpec.model_fields) - set(HostSettings.model_fields) \
        - set(CallSettings.model_fields) - set(PLACEMENT_FIELDS)
    if unknown:
        raise BadInputError(f"not a setting: {', '.join(sorted(unknown))}")

    def part(model: type[BaseModel]) -> dict[str, Any]:
        return {k: v for k, v in values.items() if k in model.model_fields}

    job_root = values.get("job_root")
    if job_root is not None:
        job_root = build_model(_JobRootOnly, {"job_root": job_root}, origin).job_root
    return OperatorInput(
        spec=build_model(TaskSpec, {"tag": DEFAULT_TAG, **part(TaskSpec)}, origin),
        host=build_model(HostSettings, part(HostSettings), origin),
        call=build_model(CallSettings, part(CallSettings), origin),
        job_root=job_root,
    )


class _JobRootOnly(Frozen):
    job_root: HostPath


def resolve(
    spec: TaskSpec, host: HostSettings, *, job_root: Path | None = None, call: CallSettings | None = None
) -> RunnerSettings:
    """The settings a task runs with: what the spec says, then its tag's profile, then the defaults.

    The one place a profile is applied, for every driver.

    Raises:
        BadInputError: the combination is refused (never expected: each part was validated).
    """
    given = spec.model_dump(exclude_none=True)
    profile = RunnerSettings(tag=spec.tag).profile
    filled = {k: v for k, v in (profile.settings_values() if profile else {}).items() if k not in given}
    if "image" in filled and spec.image_repository and profile is not None:  # a mirror: the profile's tag spelling kept
        filled["image"] = f"{spec.image_repository}:{profile.image_tag}"
    values = {
        **given, **filled, **host.model_dump(), **(call or CallSettings()).model_dump(),
        "job_root": job_root, "profile_fields": tuple(sorted(filled)),
    }
    return build_model(RunnerSettings, values, {})


def settings_for_tags(tags: list[str], flags: Mapping[str, object]) -> list[RunnerSettings]:
    """Each tag's settings: the operator's flags (read once, as a batch reads them), then the tag's own profile.

    For the commands that evaluate many tags in containers of their images (the audit, ``evaluate``).

    Raises:
        BadInputError: a flag or variable is wrong (named as typed).
    """
    operator = read_operator(flags, env_skipped=frozenset({"tag", "image"}))
    return [resolve(operator.spec.for_tag(tag), operator.host) for tag in tags]


def load_settings(**flags: object) -> RunnerSettings:
    """The settings of one call from its flags (``None``: not given) over the environment.

    Raises:
        BadInputError: naming the flag or environment variable that is wrong, as typed.
    """
    return read_operator(flags).settings()


def ensure_dir(path: Path, flag: str) -> Path:
    """A directory the operator named (``--jobs-dir``, ``--job-root``): a plain path, created when missing,
    as every command that takes one does.

    Raises:
        BadInputError: not a plain path, or it cannot be made (a file stands there, say).
    """
    path = path.expanduser().resolve()
    if not SAFE_HOST_PATH.fullmatch(str(path)):
        raise BadInputError(f"{flag} must be a path of letters, digits and '_ . @ + / ~ -', without spaces")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInputError(f"{flag} cannot be created ({e.strerror or type(e).__name__})") from e
    return path
