"""What a task is (``TaskSpec``) apart from what the host that runs it has (``HostSettings``).

The CLI's ``RunnerSettings`` describe one call; a batch, ``--attempts`` and the fleet
worker hand each task to the supervisor (``runner.supervisor``) as these two models,
serialised, and the task's own process turns them back into settings. Settings a tag's
profile may supply travel only when the operator gave them: otherwise each task gets
its own tag's profile (or the runner's defaults), not the batch's default tag's.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from runner.errors import BadInputError
from runner.settings import EvalNetwork, RunnerSettings, load_settings

# Settings a tag profile may fill in: a task carries one only when the operator gave it.
PROFILE_SETTINGS = ("eval_timeout", "eval_network", "source_dir", "apply_cmd", "test_cmd")
# Settings of one CLI call, never of a task: how it prints, which mode, the canary's base image.
CALL_SETTINGS = ("output_format", "precheck_only", "canary_base_image", "profile_fields")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TaskSpec(_Frozen):
    """One task: which tag, where its job root is, how to attempt and evaluate it."""

    tag: str
    job_root: Path
    attempt: int | None = None  # i of DIR/<tag>/attempt-<i>; None for a tag's only run
    image: str | None = None  # None: the tag's own image
    codex_timeout: float | None = None
    # None: the tag's profile, else the runner's default
    eval_timeout: float | None = None
    eval_network: EvalNetwork | None = None
    source_dir: str | None = None
    apply_cmd: str | None = None
    test_cmd: str | None = None
    model: str | None = None
    codex_profile: str | None = None
    codex_config: tuple[str, ...] = ()
    patch_exclude: tuple[str, ...] = ()
    allow_unscorable: bool = False


class HostSettings(_Frozen):
    """What the host running the task has: its codex, its Docker access, its directories."""

    codex_bin: str
    codex_home: Path | None = None
    allow_pull: bool = False
    state_dir: Path | None = None
    cache_dir: Path | None = None
    cache_max_gb: float
    agent_user: str | None = None


def task_spec(
    settings: RunnerSettings, tag: str, job_root: Path, *, image: str | None = None, attempt: int | None = None
) -> TaskSpec:
    """The task ``tag`` of a batch (or worker) whose operator gave ``settings``.

    ``image``: only an image given as a flag applies to every tag; otherwise each tag gets its own.
    """
    given = {name: getattr(settings, name) for name in PROFILE_SETTINGS if settings.operator_gave(name)}
    return TaskSpec(
        tag=tag, job_root=job_root, attempt=attempt, image=image, codex_timeout=settings.codex_timeout,
        model=settings.model, codex_profile=settings.codex_profile, codex_config=settings.codex_config,
        patch_exclude=settings.patch_exclude, allow_unscorable=settings.allow_unscorable, **given,
    )


def own_task(settings: RunnerSettings) -> TaskSpec:
    """The one task ``--execute --job-root`` names: its tag, its job root, the image if one was given.

    Raises:
        BadInputError: no job root.
    """
    if settings.job_root is None:
        raise BadInputError("--execute needs --job-root DIR (or JOB_ROOT)")
    image = settings.image if settings.operator_gave("image") else None
    return task_spec(settings, settings.tag, settings.job_root, image=image)


def host_settings(settings: RunnerSettings) -> HostSettings:
    return HostSettings(**{name: getattr(settings, name) for name in HostSettings.model_fields})


def task_settings(spec: TaskSpec, host: HostSettings) -> RunnerSettings:
    """The settings the task's own process runs with (its tag's profile filling what is unset).

    Raises:
        BadInputError: a value the settings refuse, named as the flag it stands for.
    """
    task = spec.model_dump(exclude={"attempt"}, exclude_defaults=True)
    return load_settings(**task, **host.model_dump())
