"""prepare: check the operator's prompt, then lay out the private job root.

Invariant: the prompt is checked before anything is created, so a refused run
leaves the job root exactly as it was.
"""

from __future__ import annotations

import hashlib

from reducers.models import PrepareResult
from runner.context import JobContext
from runner.errors import BadInputError
from runner.jobroot import PROMPT, SYNTHETIC_PROMPT_MARKER
from runner.settings import RunnerSettings


def source_dir_digest(settings: RunnerSettings) -> str:
    """What the job root was extracted from, recorded without putting a container path in a marker."""
    return hashlib.sha256(settings.source_dir.encode()).hexdigest()


def read_prompt(ctx: JobContext) -> bytes:
    """The prompt's bytes, refused when missing, empty or still the synthetic placeholder."""
    prompt = ctx.job.prompt
    if not prompt.is_file():
        raise BadInputError(f"the job root has no {PROMPT}; write the task prompt there first")
    data = prompt.read_bytes()
    if not data.strip():
        raise BadInputError(f"{PROMPT} is empty; write the task prompt there first")
    if SYNTHETIC_PROMPT_MARKER.encode() in data:
        raise BadInputError(f"{PROMPT} is still the synthetic placeholder; replace it with the real prompt")
    return data


def prepare(ctx: JobContext) -> PrepareResult:
    data = read_prompt(ctx)
    job = ctx.job
    for directory in (job.patch.parent, job.markers, job.logs):
        directory.mkdir(parents=True, exist_ok=True)
    return PrepareResult(
        tag=ctx.settings.tag,
        image=ctx.settings.image_name,
        prompt_sha256=hashlib.sha256(data).hexdigest(),
        prompt_bytes=len(data),
        source_dir_sha256=source_dir_digest(ctx.settings),
        agent=ctx.settings.agent.value,
    )
