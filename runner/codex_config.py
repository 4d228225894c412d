"""What the runner tells codex: its guards as ``-c key=value`` overrides, and the operator's choices.

The guards are passed on the command line, after the operator's overrides, so no
``config.toml`` or profile can drop them (a later ``-c`` wins; every key was
checked against codex-cli 0.171.0 with ``--strict-config``):
- the workspace-write sandbox keeps ``/tmp`` and ``$TMPDIR`` read-only, so a job
  root under ``/tmp`` is not writable by the agent's commands; no network;
- the agent's commands get only codex's "core" variables (HOME, PATH, USER, ...),
  and every secret-looking name is excluded on top of that, so the provider key
  codex itself needs never reaches them;
- no login shell and no shell snapshot, so the operator's dotfiles never run;
- approvals never asked (``codex exec`` cannot answer them; escalations are refused).

Also here: where ``CODEX_HOME`` is (``--codex-home``, then ``CODEX_HOME``, then the
operator's ``~/.codex``), and which provider key variable the active config names.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


# Names whose values the agent's commands must never see, on top of inherit=core.
SECRET_NAME_PATTERNS = (
    "*KEY*", "*SECRET*", "*TOKEN*", "*PASSWORD*", "*PASSWD*", "*CREDENTIAL*", "*AUTH*",
    "OPENAI_*", "CODEX_*", "AZURE_*", "AWS_*", "GOOGLE_*", "ANTHROPIC_*", "GH_*", "GITHUB_*",
)
GUARD_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("approval_policy", '"never"'),
    ("sandbox_workspace_write.exclude_slash_tmp", "true"),
    ("sandbox_workspace_write.exclude_tmpdir_env_var", "true"),
    ("sandbox_workspace_write.network_access", "false"),
    ("shell_environment_policy.inherit", '"core"'),
    ("shell_environment_policy.ignore_default_excludes", "false"),
    ("shell_environment_policy.exclude", json.dumps(list(SECRET_NAME_PATTERNS))),
    ("allow_login_shell", "false"),
    ("features.shell_snapshot", "false"),
)
# An operator's --codex-config may not touch these: they are the guards.
GUARDED_KEYS = ("approval_policy", "sandbox_mode", "sandbox_workspace_write", "shell_environment_policy",
                "allow_login_shell", "features.shell_snapshot", "sandbox_permissions")
MAX_OVERRIDE = 1000
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
KEY = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
OPENAI_PROVIDER = "openai"
# What an OpenAI login can come from besides ``codex login`` (codex exec reads these).
OPENAI_KEY_VARIABLES = ("CODEX_API_KEY", "OPENAI_API_KEY")


def check_override(item: str) -> tuple[str, str]:
    """``KEY=VALUE`` with a dotted key, on one line, not a guard.

    Raises:
        ValueError: saying what is wrong (pydantic turns it into a settings error).
    """
    if len(item) > MAX_OVERRIDE or any(c in item for c in "\n\r\0"):
        raise ValueError(f"--codex-config must be one line of at most {MAX_OVERRIDE} characters")
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not KEY.fullmatch(key):
        raise ValueError("--codex-config takes KEY=VALUE with a dotted key (letters, digits, '_', '-')")
    if any(key == guarded or key.startswith(guarded + ".") for guarded in GUARDED_KEYS):
        raise ValueError(f"--codex-config may not set {key}: the runner's guards own it")
    return key, value.strip()


def guard_arguments() -> list[str]:
    return [arg for key, value in GUARD_OVERRIDES for arg in ("-c", f"{key}={value}")]


def overrides_sha256(overrides: Sequence[str]) -> str:
    """The operator's overrides, hashed in their order (values may hold names better kept private)."""
    return hashlib.sha256("\n".join(overrides).encode()).hexdigest()


def resolve_codex_home(flag: Path | None, environ: Mapping[str, str], operator_home: Path) -> Path:
    """``--codex-home``/``CODEX_HOME`` (settings merge both), else the operator's ``~/.codex``.

    Resolved before codex gets a HOME of its own, so the login keeps working.
    """
    if flag is not None:
        return flag.expanduser().resolve()
    if environ.get("CODEX_HOME"):
        return Path(environ["CODEX_HOME"]).expanduser().resolve()
    return (operator_home / ".codex").resolve()


def _toml(path: Path) -> dict:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _parse_value(raw: str) -> object:
    """As codex does: TOML if it parses, else the raw string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _set_dotted(config: dict, key: str, value: object) -> None:
    parts = key.split(".")
    node = config
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value


@dataclass(frozen=True)
class ActiveProvider:
    name: str
    env_key: str | None  # the variable holding the key, for a provider that names one
    model: str | None  # as configured; ``--model`` wins over it


def active_provider(codex_home: Path, profile: str | None, overrides: Sequence[str]) -> ActiveProvider:
    """The provider codex will use: config.toml, then the profile's layer, then the overrides."""
    config = _toml(codex_home / "config.toml")
    if profile:
        layered = _toml(codex_home / f"{profile}.config.toml")  # 0.171.0: --profile layers this file
        legacy = config.get("profiles", {}).get(profile) if isinstance(config.get("profiles"), dict) else None
        for layer in (legacy, layered):
            if isinstance(layer, dict):
                for key, value in layer.items():
                    config[key] = value
    for item in overrides:
        key, value = check_override(item)
        _set_dotted(config, key, _parse_value(value))
    name = config.get("model_provider")
    name = name if isinstance(name, str) and name else OPENAI_PROVIDER
    providers = config.get("model_providers")
    provider = providers.get(name) if isinstance(providers, dict) else None
    env_key = provider.get("env_key") if isinstance(provider, dict) else None
    model = config.get("model")
    return ActiveProvider(
        name=name,
        env_key=env_key if isinstance(env_key, str) and ENV_NAME.fullmatch(env_key) else None,
        model=model if isinstance(model, str) and model else None,
    )


def operator_home() -> Path:
    return Path(os.path.expanduser("~"))
