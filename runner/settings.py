"""Settings: flags, then the reference script's environment variables, then defaults.

Built once at the entry point and passed down: no setting of the task is read
from the environment after that. The environment is still read for what is not a
setting: the provider key and CODEX_HOME for codex's allowlisted environment, the
secret values the public guard refuses, the state directory's XDG default, Docker's
own variables (through docker-py), the batch's lifeline and the test session label.
Every value that ends up in a container name, a label, a path or a
public file is validated here, so bad input is refused before any work.
"""

from __future__ import annotations

import os
import re
from enum import Enum
from pathlib import Path

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from runner.errors import BadInputError
from runner.profiles import TagProfile, profile_for

DEFAULT_TAG = "lagent_239"
IMAGE_REPOSITORY = "alfin06/agentissue-bench"
DEFAULT_SOURCE_DIR = "/app/source_code_buggy"
DEFAULT_APPLY_CMD = "/usr/local/bin/run_test_entrypoint.sh apply_patch /patches/attempt.patch"
DEFAULT_TEST_CMD = "/usr/local/bin/run_test_entrypoint.sh test_patched"
PATCH_IN_CONTAINER = "/patches/attempt.patch"

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
# The flags whose name is not the field's (``--eval-timeout`` is ``eval_timeout``).
_FLAG_OF_FIELD = {"output_format": "--format", "precheck_only": "--precheck"}
# Codex: a model name, a profile name, and ``-c KEY=VALUE`` overrides with a dotted key.
SAFE_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")
SAFE_PROFILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
CODEX_CONFIG_KEY = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
DEFAULT_CANARY_BASE_IMAGE = "debian:bookworm-slim"


class OutputFormat(str, Enum):
    JSON = "json"
    MARKDOWN = "markdown"


class EvalNetwork(str, Enum):
    NONE = "none"
    BRIDGE = "bridge"
    HOST = "host"


# Each setting's environment variable, in this one table: the settings read them; the
# supervisor and the tests derive from it which ones a task or a test's child must not inherit.
ENV_OF_FIELD: dict[str, str] = {
    "tag": "TAG",
    "image": "IMAGE",
    "codex_bin": "CODEX_BIN",
    "allow_pull": "ALLOW_DOCKER_PULL",
    "precheck_only": "PRECHECK_ONLY",
    "codex_timeout": "RUNNER_CODEX_TIMEOUT",
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
}
# The reference script's own variables (they keep their names here).
REFERENCE_ENV = frozenset(ENV_OF_FIELD[field] for field in (
    "tag", "image", "codex_bin", "allow_pull", "precheck_only", "source_dir", "apply_cmd", "test_cmd", "job_root",
))
# Those that name one task or one call: a supervisor's task gets its own in its request instead.
TASK_ENV = frozenset(ENV_OF_FIELD[field] for field in ("tag", "image", "job_root", "precheck_only"))


def is_safe_tag(tag: str) -> bool:
    """A tag the runner takes (a Docker tag, no path tricks): the settings, a tags file, submit, the worker."""
    return bool(SAFE_TAG.fullmatch(tag)) and ".." not in tag


def _env(field: str) -> AliasChoices:
    """The flag's name (as an init keyword) and, when it has one, the setting's variable."""
    return AliasChoices(field, ENV_OF_FIELD[field]) if field in ENV_OF_FIELD else AliasChoices(field)


class RunnerSettings(BaseSettings):
    """One task's settings. Flag values are passed as init kwargs and win over the environment."""

    model_config = SettingsConfigDict(
        case_sensitive=True, populate_by_name=True, extra="forbid", frozen=True
    )

    tag: str = Field(DEFAULT_TAG, validation_alias=_env("tag"))
    image: str | None = Field(None, validation_alias=_env("image"))
    codex_bin: str = Field("codex", validation_alias=_env("codex_bin"))
    allow_pull: bool = Field(False, validation_alias=_env("allow_pull"))
    precheck_only: bool = Field(False, validation_alias=_env("precheck_only"))
    codex_timeout: float = Field(
        3600.0, ge=MIN_TIMEOUT_SECONDS, le=MAX_TIMEOUT_SECONDS, allow_inf_nan=False,
        validation_alias=_env("codex_timeout"),
    )
    eval_timeout: float = Field(
        300.0, ge=MIN_TIMEOUT_SECONDS, le=MAX_TIMEOUT_SECONDS, allow_inf_nan=False,
        validation_alias=_env("eval_timeout"),
    )
    eval_network: EvalNetwork = Field(
        EvalNetwork.BRIDGE, validation_alias=_env("eval_network")
    )
    source_dir: str = Field(
        DEFAULT_SOURCE_DIR, validation_alias=_env("source_dir")
    )
    apply_cmd: str = Field(DEFAULT_APPLY_CMD, validation_alias=_env("apply_cmd"))
    test_cmd: str = Field(DEFAULT_TEST_CMD, validation_alias=_env("test_cmd"))
    output_format: OutputFormat = Field(
        OutputFormat.JSON, validation_alias=_env("output_format")
    )
    job_root: Path | None = Field(None, validation_alias=_env("job_root"))
    # Where the runner keeps its own record of each job root, outside every job root.
    state_dir: Path | None = Field(None, validation_alias=_env("state_dir"))
    # The extraction cache (host-wide, outside every job root): where, and how large at most (0: off).
    cache_dir: Path | None = Field(None, validation_alias=_env("cache_dir"))
    cache_max_gb: float = Field(
        20.0, ge=0, le=1_000_000, allow_inf_nan=False, validation_alias=_env("cache_max_gb")
    )
    # An unprivileged user the agent runs as (the runner must be root): it can write only buggy-source/.
    agent_user: str | None = Field(None, validation_alias=_env("agent_user"))
    model: str | None = Field(None, validation_alias=_env("model"))
    codex_profile: str | None = Field(None, validation_alias=_env("codex_profile"))
    codex_config: tuple[str, ...] = Field((), validation_alias=_env("codex_config"))
    codex_home: Path | None = Field(None, validation_alias=_env("codex_home"))
    patch_exclude: tuple[str, ...] = Field((), validation_alias=_env("patch_exclude"))
    canary_base_image: str = Field(
        DEFAULT_CANARY_BASE_IMAGE, validation_alias=_env("canary_base_image")
    )
    # Evaluate a tag that precheck would refuse as unscorable; recorded in the compact run.
    allow_unscorable: bool = Field(
        False, validation_alias=_env("allow_unscorable")
    )
    # The settings the tag's profile supplied (the operator gave none): set by load_settings only.
    profile_fields: tuple[str, ...] = Field((), validation_alias=_env("profile_fields"))

    @field_validator("tag")
    @classmethod
    def _tag_is_safe_label(cls, value: str) -> str:
        if not is_safe_tag(value):
            raise ValueError(
                "must be 1-120 letters, digits, '_', '.' or '-', starting with a letter, digit or '_', without '..'"
            )
        return value

    @field_validator("codex_bin")
    @classmethod
    def _codex_bin_is_plain(cls, value: str) -> str:
        if not value or len(value) > 4096 or any(c in value for c in "\n\r\0"):
            raise ValueError("must be a command name or a path")
        return value

    @field_validator("source_dir")
    @classmethod
    def _source_dir_is_container_path(cls, value: str) -> str:
        if not SAFE_CONTAINER_PATH.fullmatch(value) or ".." in value.split("/") or value == "/":
            raise ValueError("must be an absolute path inside the image, without '..' or spaces")
        return value.rstrip("/")

    @field_validator("job_root", "cache_dir")
    @classmethod
    def _job_root_is_plain(cls, value: Path | None) -> Path | None:
        if value is not None and (not SAFE_HOST_PATH.fullmatch(str(value)) or ".." in value.parts):
            raise ValueError("must be a path of letters, digits and '_ . @ + / ~ -', without '..' or spaces")
        return value

    @field_validator("agent_user")
    @classmethod
    def _agent_user_is_a_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", value):
            raise ValueError("must be a user name (lower-case letters, digits, '_' or '-')")
        return value

    @field_validator("apply_cmd", "test_cmd")
    @classmethod
    def _command_is_one_line(cls, value: str) -> str:
        if not value.strip() or len(value) > 2000 or any(c in value for c in "\n\r\0"):
            raise ValueError("must be one non-empty line of shell")
        return value

    @field_validator("model")
    @classmethod
    def _model_is_plain(cls, value: str | None) -> str | None:
        if value is not None and not SAFE_MODEL.fullmatch(value):
            raise ValueError("--model must be 1-128 letters, digits and '. _ : / @ + -'")
        return value

    @field_validator("codex_profile")
    @classmethod
    def _profile_is_plain(cls, value: str | None) -> str | None:
        if value is not None and (not SAFE_PROFILE.fullmatch(value) or ".." in value):
            raise ValueError("--codex-profile must be 1-64 letters, digits, '_', '.' or '-'")
        return value

    @field_validator("codex_config")
    @classmethod
    def _codex_config_is_key_value(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from runner.codex_config import check_override  # codex's own rules live beside the guards

        for item in value:
            check_override(item)
        return value

    @field_validator("patch_exclude")
    @classmethod
    def _patch_exclude_is_pattern(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from runner.hygiene import check_pattern

        for item in value:
            check_pattern(item)
        return value

    @field_validator("canary_base_image")
    @classmethod
    def _canary_base_is_image(cls, value: str) -> str:
        if not SAFE_IMAGE.fullmatch(value) or ".." in value:
            raise ValueError("--canary-base-image must be a plain image reference")
        return value

    @model_validator(mode="after")
    def _image_is_safe(self) -> RunnerSettings:
        image = self.resolved_image
        if not SAFE_IMAGE.fullmatch(image) or ".." in image:
            raise ValueError(f"image must be a plain image reference, got {image[:80]!r}")
        return self

    @property
    def resolved_image(self) -> str:
        return self.image or f"{IMAGE_REPOSITORY}:{self.tag}"

    @property
    def profile(self) -> TagProfile | None:
        return profile_for(self.tag)

    def operator_gave(self, name: str) -> bool:
        """Was ``name`` set by a flag or an environment variable (not a default or a profile)?"""
        return name in self.model_fields_set and name not in self.profile_fields


def _as_typed(field: str, given: dict[str, object]) -> str:
    """The name the user typed: the flag when it came as one, else its environment variable."""
    if field in given:
        return _FLAG_OF_FIELD.get(field, "--" + field.replace("_", "-"))
    info = RunnerSettings.model_fields.get(field)
    choices = getattr(info.validation_alias, "choices", []) if info is not None else []
    return next((name for name in choices if isinstance(name, str) and name.isupper()), field)


def _image_as_typed(given: dict[str, object]) -> str:
    """The image is checked whole (after the tag filled it in): name where it came from."""
    if "image" in given:
        return "--image"
    return "IMAGE" if os.environ.get("IMAGE") else "--tag"


def load_settings(**flags: object) -> RunnerSettings:
    """Build settings from flags (``None`` means 'not given') over the environment.

    Raises:
        BadInputError: naming the flag or environment variable that is wrong, as typed.
    """
    given = {key: value for key, value in flags.items() if value is not None}
    try:
        settings = RunnerSettings(**given)
        profile = settings.profile
        if profile is None:
            return settings  # an unknown tag: the runner's defaults
        # The profile fills only what neither a flag nor an environment variable set.
        filled = {k: v for k, v in profile.settings_values().items() if k not in settings.model_fields_set}
        if not filled:
            return settings
        return RunnerSettings(**given, **filled, profile_fields=tuple(sorted(filled)))
    except ValidationError as e:
        problems = []
        for err in e.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            where = _as_typed(field, given) if field else _image_as_typed(given)
            message = str(err["msg"]).removeprefix("Value error, ")
            problems.append(f"{where}: {message}")
        raise BadInputError("invalid settings: " + "; ".join(problems)) from e
