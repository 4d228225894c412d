"""extract: the image's buggy source, and nothing else, into ``buggy-source/``.

Invariants: the container is created and never started, and removed when done;
the archive streams into the extractor chunk by chunk; only ``--source-dir`` is
copied and its ``.git`` is left out, so no oracle reaches the agent; the tree
lands in a scratch directory first and is renamed into place only when whole;
an extract that fails leaves no tree (a rerun could not tell it from an operator's);
the extraction cache can only save work, never fail the attempt; the whole phase (the
cache's lock and checkout, the stream, the cache's baseline commit) ends at
``--extract-timeout`` as an infrastructure failure (``runner.deadline``): a read the
daemon stalls is woken by shutting its socket down, a stream that never ends is cut
between chunks, git is killed.
"""

from __future__ import annotations

from pathlib import Path

import structlog
from docker.errors import NotFound

from reducers.models import ExtractResult, Phase
from runner.context import JobContext
from runner.images import task_image
from runner.docker_utils import (
    archive_stream_with_stat,
    image_identity,
    is_symlink_stat,
    managed_container,
)
from runner.errors import BadInputError, PhaseError, SourceDirMissingError
from runner.extraction_cache import (
    CACHE_FAULTS,
    CacheEntryError,
    EntryRecord,
    ExtractionCache,
    TreeStats,
    cache_key,
    why,
)
from runner.deadline import PhaseDeadline
from runner.faults import crash_point
from runner.jobroot import BUGGY_SOURCE
from runner.phases.baseline import build_baseline
from runner.safe_extract import extract_tree
from runner.settings import SAFE_CONTAINER_PATH, RunnerSettings
from runner.trees import remove_tree

log = structlog.get_logger(__name__)

SCRATCH_PREFIX = ".buggy-source.partial"
# Files an empty checked-in placeholder may hold; anything else means work is there.
PLACEHOLDERS = frozenset({".gitkeep"})


def _refuse_occupied(target: Path) -> None:
    if target.exists() and any(entry.name not in PLACEHOLDERS for entry in target.iterdir()):
        raise BadInputError(
            f"{BUGGY_SOURCE}/ is not empty but no extraction was recorded for it; "
            "move it aside (nothing was overwritten) and run again"
        )


EXTRACT_TIMEOUT_FLAG = "--extract-timeout"


def extract(ctx: JobContext) -> ExtractResult:
    """Raises: BadInputError, EnvironmentNotReadyError (source dir missing), PhaseError (empty tree),
    PhaseTimeoutError ``extract_timeout`` (past ``--extract-timeout``, nothing left behind).

    With the extraction cache on, a miss also commits the baseline here (the baseline
    phase then finds it), so the entry is filled under its key's lock before anyone
    else reads it; a hit checks the entry out without Docker. A cache that cannot be
    locked, read or filled is a warning, and the attempt extracts from the image.
    """
    with PhaseDeadline("extract", ctx.settings.extract_timeout, flag=EXTRACT_TIMEOUT_FLAG) as deadline:
        return _extract(ctx, deadline)


def _extract(ctx: JobContext, deadline: PhaseDeadline) -> ExtractResult:
    settings, job = ctx.settings, ctx.job
    target = job.buggy_source
    if ctx.journal is not None and ctx.journal.extraction_was_placing():
        # A run died between placing its tree and recording it: the tree is the runner's own.
        log.warning("unrecorded_extraction_removed", action="extracting again")
        remove_tree(target)
    _refuse_occupied(target)
    for stale in job.root.glob(f"{SCRATCH_PREFIX}*"):
        remove_tree(stale)  # left by a run that died mid-extraction
    if job.baseline_git_dir.exists():
        remove_tree(job.baseline_git_dir)  # of an extraction never recorded: made again with the tree
    cache = extraction_cache(settings)
    if cache is None:
        return _from_image(ctx, deadline, *_image(ctx))
    recorded = _recorded_image(ctx)
    image_id, digest = recorded or _image(ctx)
    key = cache_key(image_id, settings.source_dir)
    # Not held: the cache's file system refused it (warned), or another attempt held it to the deadline.
    with cache.locked(key, wait_seconds=deadline.remaining()) as held:
        record = cache.lookup(key) if held else None
        if record is not None:
            try:
                return _from_cache(ctx, cache, key, record, digest)
            except CacheEntryError as e:  # the checkout left nothing: extract from the image again
                log.warning("cache_entry_discarded", key=key[:12], reason=str(e))
                cache.discard(key)
            except CACHE_FAULTS as e:  # a sound entry this job could not take (its disk is full?): the image decides
                log.warning("cache_checkout_failed", key=key[:12], reason=why(e), action="extracting from the image")
        if recorded is not None:
            image_id_now, digest = _image(ctx)  # a miss needs Docker anyway: extract what the tag is now
        else:
            image_id_now = image_id
        result = _from_image(ctx, deadline, image_id_now, digest)
        if held and image_id_now == image_id:  # else (the tag moved since precheck) the baseline phase commits
            _fill(ctx, cache, key, result)
        return result


def _fill(ctx: JobContext, cache: ExtractionCache, key: str, result: ExtractResult) -> None:
    """Commit the baseline of the tree just placed and store both in the cache.

    A failed or interrupted commit removes the tree and the baseline: once the failure
    is recorded, the journal no longer says the tree is the runner's own, and the rerun would
    refuse it as an operator's. A failed store is the cache's warning only.
    """
    job = ctx.job
    try:
        build_baseline(job)
    except BaseException:
        for made in (job.baseline_git_dir, job.buggy_source):
            remove_tree(made)
        raise
    cache.store(
        key, image_id=result.image_id, source_dir=ctx.settings.source_dir, baseline_git_dir=job.baseline_git_dir,
        tree=job.buggy_source, image_digest=result.image_digest,
        stats=TreeStats(
            files=result.file_count, directories=result.directory_count, symlinks=result.symlink_count,
            bytes=result.byte_count, oracle_entries_skipped=result.oracle_entries_skipped,
        ),
    )


def extraction_cache(settings: RunnerSettings) -> ExtractionCache | None:
    """The host's cache, or None when ``--cache-max-gb 0`` turned it off."""
    return ExtractionCache.for_settings(settings) if settings.cache_max_gb > 0 else None


def _image(ctx: JobContext) -> tuple[str, str | None]:
    image = task_image(ctx.docker(), ctx.settings)
    return image_identity(image)


def _recorded_image(ctx: JobContext) -> tuple[str, str | None] | None:
    """The image id precheck resolved in this job root: a cache hit needs no Docker call of its own."""
    marker = ctx.journal.marker(Phase.PRECHECK) if ctx.journal is not None else None
    image_id = marker.details.image_id if marker is not None and marker.ok else None
    return (image_id, None) if isinstance(image_id, str) and image_id else None


def _from_cache(
    ctx: JobContext, cache: ExtractionCache, key: str, record: EntryRecord, digest: str | None
) -> ExtractResult:
    job = ctx.job
    scratch = job.root / f"{SCRATCH_PREFIX}-{ctx.run_id}"
    try:
        cache.checkout(key, record, baseline_git_dir=job.baseline_git_dir, tree=scratch)
        if job.buggy_source.exists():
            remove_tree(job.buggy_source)  # only placeholders, checked above
        if ctx.journal is not None:
            ctx.journal.extract_placing(ctx.run_id)
        scratch.rename(job.buggy_source)
        crash_point("extract-placed")
    finally:
        if scratch.exists():
            remove_tree(scratch)
    log.info("extracted_from_cache", key=key[:12])
    stats = record.stats
    return ExtractResult(
        image_id=record.image_id,
        image_digest=digest or record.image_digest,
        file_count=stats.files,
        directory_count=stats.directories,
        symlink_count=stats.symlinks,
        byte_count=stats.bytes,
        oracle_entries_skipped=stats.oracle_entries_skipped,
        oracle_entries_extracted=int((job.buggy_source / ".git").exists()),
        from_cache=True,
    )


def _from_image(ctx: JobContext, deadline: PhaseDeadline, image_id: str, digest: str | None) -> ExtractResult:
    deadline.check()  # a cache checkout or lock wait may have used it all
    settings, job = ctx.settings, ctx.job
    target = job.buggy_source
    client = ctx.docker()
    scratch = job.root / f"{SCRATCH_PREFIX}-{ctx.run_id}"
    try:
        with managed_container(
            client, image=image_id, labels=ctx.labels(Phase.EXTRACT), network_disabled=True
        ) as container:
            try:
                stream, stat = archive_stream_with_stat(container, settings.source_dir, on_chunk=deadline.check)
            except NotFound as e:
                raise SourceDirMissingError() from e
            log.info("archive_stream_opened")
            with stream, deadline.on_expiry(stream.abort):
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
