"""One attempt as its job root holds it: the prompt, codex's trajectory, the patch, the evaluation,
the verdicts and where the time went (what ``show``, ``export`` and ``report --private`` present).

Read only: nothing in the job root is written, locked or created, so it is safe on an attempt
still running (its lock is never taken: the holder's pid is read from the lock file). Every file
is read through ``runner.bounded_read`` (inside the job root, no FIFO waited on, bounded).
The result holds private text (the prompt, messages, commands' output, the patch, the logs):
it is for the operator's terminal and the private report only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from reducers.errors import CompactInputError
from reducers.markers import marker_filename, read_marker
from reducers.models import PHASE_ORDER, Marker, Phase
from runner.bounded_read import read_bounded, read_tail
from runner.containment.run_owner import stat_fields
from runner.errors import BadInputError, NotAJobRootError, UnreadableFileError
from runner.jobroot import PROMPT, JobRoot, written_run
from runner.lock import LOCK_NAME
from runner.agents.codex import PRIVATE_CODEX_HOME, STDOUT_LOG
from runner.phases.evaluate import APPLY_LOG, APPLY_STDERR_LOG, TEST_LOG, TEST_STDERR_LOG
from runner.phases.patch import diffstat
from runner.pricing import RateCard
from runner.trajectory.events import ExecStream, read_exec_stream
from runner.trajectory.model import Trajectory, build_trajectory
from runner.trajectory.session import read_session_record

PROMPT_MAX_BYTES = 1 << 20
PATCH_MAX_BYTES = 64 << 20  # the patch phase's own bound
LOG_TAIL_BYTES = 16 << 10
EVAL_LOGS = (APPLY_LOG, APPLY_STDERR_LOG, TEST_LOG, TEST_STDERR_LOG)


@dataclass(frozen=True)
class PhaseTime:
    phase: str
    status: str  # ok, failed
    seconds: float
    reason: str


@dataclass(frozen=True)
class Evaluation:
    apply_exit_code: int | None
    test_exit_code: int | None
    timed_out: bool
    resolved: bool  # the official verdict
    exit_code_verdict: bool
    string_verdict: bool | None
    verdicts_disagree: bool
    log_tails: dict[str, str]  # log name -> its last lines (private)


@dataclass(frozen=True)
class PatchView:
    files: list[tuple[str, int, int]]  # (path, added, removed)
    size: int
    text: bytes  # the patch (private)


@dataclass(frozen=True)
class AttemptView:
    root: Path
    tag: str
    prompt: str | None
    trajectory: Trajectory | None  # None: codex has not written its stream (yet)
    phases: list[PhaseTime] = field(default_factory=list)
    patch: PatchView | None = None
    evaluation: Evaluation | None = None
    terminal_state: str | None = None
    resolved: bool | None = None
    failure_label: str | None = None
    running: bool = False
    last_message: str | None = None

    @property
    def prompt_head(self) -> list[str]:
        return (self.prompt or "").strip("\n").splitlines()[:5]


def _tag_of(root: Path, markers: dict[Phase, Marker]) -> str | None:
    prepare = markers.get(Phase.PREPARE)
    if prepare is not None and getattr(prepare.details, "tag", ""):
        return prepare.details.tag
    run = written_run(root)
    if run is not None and getattr(run, "tag", None):
        return run.tag
    patches = root / "Patches"
    found = [p.name for p in patches.iterdir() if p.is_dir()] if patches.is_dir() and not patches.is_symlink() else []
    return found[0] if len(found) == 1 else None


def read_markers_tolerant(markers_dir: Path) -> dict[Phase, Marker]:
    """Every readable marker (one an interrupted write left broken is passed over, not fatal here)."""
    found: dict[Phase, Marker] = {}
    for phase in PHASE_ORDER:
        path = markers_dir / marker_filename(phase)
        if path.is_file() and not path.is_symlink():
            try:
                found[phase] = read_marker(path, expected_phase=phase)
            except CompactInputError:
                continue
    return found


def lock_holder_alive(root: Path) -> bool:
    """Whether the runner that last locked this job root still lives (read from the lock file, never locked:
    taking even a shared lock could make a runner starting now refuse the job root as busy).

    A pid reused by another program is not a runner: the holder's command line must name the runner.
    """
    try:
        fd = os.open(root / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    finally:
        os.close(fd)
    if not text.isdigit():
        return False
    fields = stat_fields(text)
    if not fields or fields[0] == "Z":
        return False
    try:
        with open(f"/proc/{text}/cmdline", "rb") as handle:
            words = handle.read(1 << 16).split(b"\0")
    except OSError:
        return False
    return b"runner" in words or any(word.endswith((b"/runner", b"agentissue-runner")) for word in words)


def _text_or_none(path: Path, root: Path, max_bytes: int) -> str | None:
    try:
        return read_bounded(path, root=root, max_bytes=max_bytes).decode("utf-8", errors="replace")
    except UnreadableFileError:
        return None


def _tail(path: Path, root: Path, lines: int) -> str | None:
    try:
        data, cut = read_tail(path, root=root, max_bytes=LOG_TAIL_BYTES)
    except UnreadableFileError:
        return None
    kept = data.decode("utf-8", errors="replace").splitlines()
    if cut and kept:
        kept = kept[1:]  # the first line is a piece of one
    return "\n".join(kept[-lines:])


def check_job_root(path: Path) -> Path:
    """Raises: NotAJobRootError (not a directory, or nothing of an attempt in it)."""
    root = path.expanduser()
    if not root.is_dir():
        raise NotAJobRootError(f"--job-root {root.name or str(root)} is not a directory")
    root = root.resolve()
    if not any((root / name).exists() for name in (PROMPT, "result-markers", "logs")):
        raise NotAJobRootError(f"--job-root {root.name}: no attempt here (no context/prompt.md, result-markers/ "
                               "or logs/); for a batch give --jobs-dir DIR --tag T")
    return root


def read_stream(root: Path) -> ExecStream | None:
    job_logs = root / "logs"
    try:
        return read_exec_stream(job_logs / STDOUT_LOG, root=root)
    except UnreadableFileError:
        return None


def read_attempt(path: Path, *, card: RateCard | None, tail_lines: int = 20) -> AttemptView:
    """Everything ``show`` presents of the attempt at ``path``.

    Raises:
        NotAJobRootError: ``path`` is not a job root.
    """
    root = check_job_root(path)
    markers = read_markers_tolerant(root / "result-markers")
    tag = _tag_of(root, markers) or root.name
    job = JobRoot(root=root, tag=tag)
    codex = markers.get(Phase.CODEX)
    model = codex.details.model if codex is not None else None
    stream = read_stream(root)
    trajectory = None
    if stream is not None:
        record = read_session_record(job.agent_home / PRIVATE_CODEX_HOME, root=root)
        trajectory = build_trajectory(stream, record, model=model, card=card, tree=str(job.buggy_source))
        if codex is not None and codex.details.cost_known:  # the cost the run itself priced and recorded
            trajectory = replace(trajectory, cost_usd=codex.details.cost_usd)
    patch = None
    try:
        text = read_bounded(job.patch, root=root, max_bytes=PATCH_MAX_BYTES)
        patch = PatchView(diffstat(text), len(text), text)
    except UnreadableFileError:
        pass
    evaluation = None
    evaluate = markers.get(Phase.EVALUATE)
    if evaluate is not None or (job.logs / APPLY_LOG).exists():
        details = evaluate.details if evaluate is not None else None
        tails = {name: tail for name in EVAL_LOGS if (tail := _tail(job.logs / name, root, tail_lines)) is not None}
        evaluation = Evaluation(
            apply_exit_code=getattr(details, "apply_exit_code", None), test_exit_code=getattr(details, "test_exit_code", None),
            timed_out=bool(getattr(details, "timed_out", False)), resolved=bool(getattr(details, "resolved", False)),
            exit_code_verdict=bool(getattr(details, "exit_code_verdict", False)),
            string_verdict=getattr(details, "string_verdict", None),
            verdicts_disagree=bool(getattr(details, "verdicts_disagree", False)), log_tails=tails)
    reduce = markers.get(Phase.REDUCE)
    return AttemptView(
        root=root, tag=tag, prompt=_text_or_none(job.prompt, root, PROMPT_MAX_BYTES), trajectory=trajectory,
        phases=[PhaseTime(p.value, m.status.value, m.duration_seconds, str(m.reason)) for p, m in markers.items()],
        patch=patch, evaluation=evaluation,
        terminal_state=str(reduce.details.terminal_state) if reduce is not None else None,
        resolved=reduce.details.resolved if reduce is not None else None,
        failure_label=(reduce.details.failure_label or None) if reduce is not None else None,
        running=reduce is None and lock_holder_alive(root),
        last_message=_text_or_none(job.last_message, root, PROMPT_MAX_BYTES),
    )


def attempt_root(jobs_dir: Path, tag: str, attempt: int | None) -> Path:
    """A batch's job root of ``tag`` (``DIR/<tag>``, or ``DIR/<tag>/attempt-<i>``).

    Raises:
        BadInputError: ``jobs_dir`` is not a directory, or the tag has several attempts and none was named.
    """
    base = jobs_dir.expanduser()
    if not base.is_dir():
        raise BadInputError(f"--jobs-dir {base.name or str(base)} is not a directory")
    root = base / tag
    if attempt is not None:  # a batch without --attempts keeps DIR/<tag>, and its ledger calls it attempt 1
        numbered = root / f"attempt-{attempt}"
        return root if attempt == 1 and not numbered.is_dir() else numbered
    attempts = sorted(p.name for p in root.glob("attempt-*") if p.is_dir()) if root.is_dir() else []
    if len(attempts) > 1:
        raise BadInputError(f"{tag} has {len(attempts)} attempts ({', '.join(attempts)}): say which with --attempt I")
    return root / attempts[0] if attempts else root
