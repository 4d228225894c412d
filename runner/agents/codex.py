"""Codex behind the agent seam: ``codex exec --json`` in the buggy source.

Invariants:
- the agent is given only ``buggy-source/`` (``--cd``), never the job root;
- the child's environment is the allowlist (plus the provider key variable the active
  config names), and is never logged; its HOME is the phase's private scratch directory
  and its CODEX_HOME a private one linked to the operator's (``runner.codex_meter``), so its
  session record stays in the job root and the meter reads the usage from it as it grows;
- the runner's guards go on the command line as ``-c`` overrides, after the operator's
  (``runner/codex_config.py``), so no config file can drop them;
- codex writes its last message to ``job.last_message`` itself (``--output-last-message``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from runner.agents import AgentName, CliAgent, Launch
from runner.codex_config import (
    active_provider,
    guard_arguments,
    operator_home,
    overrides_sha256,
    resolve_codex_home,
)
from runner.codex_meter import UsageMeter, private_codex_home
from runner.codex_usage import CodexUsage, usage_from_events
from runner.errors import CodexNotFoundError
from runner.settings import SAFE_MODEL

if TYPE_CHECKING:
    from runner.context import JobContext
    from runner.host_memory import HostMemory
    from runner.phases.precheck import Check
    from runner.settings import RunnerSettings

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


def allowed_environment(environ: Mapping[str, str], allowlist: frozenset[str], *extra: str | None) -> dict[str, str]:
    """``environ`` reduced to ``allowlist``, the locale (``LC_*``) and the ``extra`` names given."""
    return {k: v for k, v in environ.items() if k in allowlist or k.startswith("LC_") or (k in extra and k)}


def child_environment(
    environ: Mapping[str, str], *, provider_key: str | None = None, home: Path | None = None,
    codex_home: Path | None = None,
) -> dict[str, str]:
    """The allowlist, the active provider's key variable, and HOME/CODEX_HOME when given.

    With a HOME given and no CODEX_HOME, codex uses (and makes) one under that HOME.
    """
    env = allowed_environment(environ, ENV_ALLOWLIST, provider_key)
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


def _model_of(settings_model: str | None, provider_model: str | None) -> str | None:
    return settings_model or (provider_model if provider_model and SAFE_MODEL.fullmatch(provider_model) else None)


class CodexAgent(CliAgent):
    name = AgentName.CODEX
    log_name = "codex"
    bin_setting = "codex_bin"
    missing = CodexNotFoundError

    def version(self, settings: RunnerSettings) -> str:
        from runner.phases.precheck import codex_version

        return codex_version(settings.codex_bin)

    def login(self, settings: RunnerSettings, memory: HostMemory | None = None) -> Check:
        from runner.phases.precheck import codex_login

        return codex_login(settings.codex_bin, settings.codex_home, settings.codex_profile, settings.codex_config,
                           memory)

    def launch(self, ctx: JobContext, path: str, home: Path) -> Launch:
        settings, job = ctx.settings, ctx.job
        codex_home = resolve_codex_home(settings.codex_home, os.environ, operator_home())
        provider = active_provider(codex_home, settings.codex_profile, settings.codex_config)
        job.last_message.unlink(missing_ok=True)
        argv = codex_argv(
            path, job.buggy_source, job.last_message,
            model=settings.model, profile=settings.codex_profile, overrides=settings.codex_config,
        )
        private_home = private_codex_home(codex_home if codex_home.is_dir() else None, home / PRIVATE_CODEX_HOME)
        environment = child_environment(os.environ, provider_key=provider.env_key, home=home, codex_home=private_home)
        return Launch(
            argv=argv, env=environment, meter=UsageMeter(private_home),
            model=_model_of(settings.model, provider.model), overrides_sha256=overrides_sha256(settings.codex_config),
        )

    def finish(self, ctx: JobContext, stdout: Path) -> CodexUsage:
        return usage_from_events(stdout)
