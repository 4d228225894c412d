"""extract: the image's buggy source, and nothing else, into ``buggy-source/``.

Invariants: the container is created and never started, and removed when done;
the archive streams into the extractor chunk by chunk; only ``--source-dir`` is
copied and its ``.git`` is left out, so no oracle reaches the agent; the tree
lands in a scratch directory first and is renamed into place only when whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import structlog
from docker.errors import NotFound

from reducers.models import Phase
from runner.context import JobContext, PhaseResult
from runner.docker_utils import (
    archive_stream_with_stat,
    ensure_image,
    image_identity,
    is_symlink_stat,
    managed_container,
)
from runner.errors import BadInputError, PhaseError, SourceDirMissingError
from runner.faults import crash_point
from runner.jobroot import BUGGY_SOURCE
from runner.safe_extract import extract_tree
from runner.settings import SAFE_CONTAINER_PATH
from runner.trees import remove_tree

log = structlog.get_logger(__name__)

SCRATCH_PREFIX = ".buggy-source.partial"
# Files an empty checked-in placeholder may hold; anything else means work is there.
PLACEHOLDERS = frozenset({".gitkeep"})


@dataclass(frozen=True)
class ExtractResult(PhaseResult):
    phase = Phase.EXTRACT
    image_id: str = ""
    image_digest: str | None = None
    file_count: int = 0
    directory_count: int = 0
    symlink_count: int = 0
    byte_count: int = 0
    oracle_entries_skipped: int = 0
    oracle_entries_extracted: int = 0


def _refuse_occupied(target: Path) -> None:
    if target.exists() and any(entry.name not in PLACEHOLDERS for entry in target.iterdir()):
        raise BadInputError(
            f"{BUGGY_SOURCE}/ is not empty but no extraction was recorded for it; "
            "move it aside (nothing was overwritten) and run again"
        )


def extract(ctx: JobContext) -> ExtractResult:
    """Raises: BadInputError, EnvironmentNotReadyError (source dir missing), PhaseError (empty tree)."""
    settings, job = ctx.settings, ctx.job
    target = job.buggy_source
    if ctx.journal is not None and ctx.journal.extraction_was_placing():
        # A run died between placing its tree and recording it: the tree is the runner's own.
        log.warning("unrecorded_extraction_removed", action="extracting again")
        remove_tree(target)
    _refuse_occupied(target)
    client = ctx.docker()
    image = ensure_image(client, settings.resolved_image, allow_pull=settings.allow_pull)
    image_id, digest = image_identity(image)
    for stale in job.root.glob(f"{SCRATCH_PREFIX}*"):
        remove_tree(stale)  # left by a run that died mid-extraction
    scratch = job.root / f"{SCRATCH_PREFIX}-{ctx.run_id}"
    try:
        with managed_container(
            client, image=image_id, labels=ctx.labels(Phase.EXTRACT), network_disabled=True
        ) as container:
            try:
                stream, stat = archive_stream_with_stat(container, settings.source_dir)
            except NotFound as e:
                raise SourceDirMissingError() from e
            log.info("archive_stream_opened")
            with stream:
                if is_symlink_stat(stat):  # the archive would hold the link alone: "no files" said nothing
                    target = str(stat.get("linkTarget") or "")
                    shown = f" (to {target})" if SAFE_CONTAINER_PATH.fullmatch(target) else ""
                    raise PhaseError(
                        "extract", "source_dir_is_symlink",
                        f"--source-dir {settings.source_dir} is a symbolic link in the image{shown}; "
                        "pass the directory it points to as --source-dir",
                    )
                stats = extract_tree(stream, scratch)
        if stats.files == 0:
            raise PhaseError("extract", "empty_source", "the image's buggy-source directory holds no files")
        if target.exists():
            remove_tree(target)  # only placeholders, checked above
        if ctx.journal is not None:
            ctx.journal.extract_placing(ctx.run_id)
        scratch.rename(target)
        crash_point("extract-placed")
    finally:
        if scratch.exists():
            remove_tree(scratch)
    return ExtractResult(
        image_id=image_id,
        image_digest=digest,
        file_count=stats.files,
        directory_count=stats.directories,
        symlink_count=stats.symlinks,
        byte_count=stats.bytes,
        oracle_entries_skipped=stats.oracle_entries_skipped,
        oracle_entries_extracted=int((target / ".git").exists()),
    )
