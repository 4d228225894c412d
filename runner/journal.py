"""The runner's own record of where a job root is, kept where no agent can write it, and
the marker files (``result-markers/<phase>.json``) it keeps as copies.

Invariants:
- the journal lives in the runner's state directory (``--state-dir``, outside every
  job root; 0700), never in a job root: codex's sandbox cannot write it, and an
  agent run as ``--agent-user`` cannot even read it;
- a phase is done only when the journal records its ``ok`` marker: the files under
  ``result-markers/`` are copies for people and reducers, rewritten from the
  journal (and removed when it has no record) before they are read, so a marker
  an agent wrote (in its own job root or a sibling's) is never trusted; a marker
  file deleted (by the operator, to redo a phase) drops the record: a deletion
  can only cause honest work again, never a verdict;
- the marker file is written before the journal: a crash between them leaves a
  file with no record, which is removed, and the phase runs again;
- it records when an agent starts and when it was seen to end: a rerun that
  finds an agent recorded as running makes sure its namespace is empty first;
- one journal per job id, and one job id per job root: a copied job root
  (``cp -a`` keeps ``.runner-job-id``) is detected and gets an id of its own.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import structlog
from pydantic import ValidationError

from reducers.markers import marker_filename, read_marker
from reducers.models import Marker, MarkerStatus, Phase, PhaseResult, marker_type
from runner.atomic import render_json, write_bytes_atomic, write_json_atomic
from runner.errors import BadInputError
from runner.jobroot import JOB_ID_FILE, JobRoot
from runner.trees import remove_tree

log = structlog.get_logger(__name__)

_JOB_ID = re.compile(r"[0-9a-f]{16}")


def default_state_dir() -> Path:
    """Root's under /var/lib; anyone else's under ``$XDG_STATE_HOME`` (or ``~/.local/state``)."""
    if os.geteuid() == 0:
        return Path("/var/lib/agentissue-runner")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "agentissue-runner"


def _read_job_id(root: Path) -> str | None:
    try:
        text = (root / JOB_ID_FILE).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if _JOB_ID.fullmatch(text) else None


@dataclass
class Journal:
    """The runner's own record of one job root, kept in the state dir, outside every job root.

    It holds each phase's marker as the runner wrote it and the agent's process while it
    runs, so a resume trusts only what this record says: a marker file in the job root is
    its copy, replaced when it differs, and an agent a dead run left is found and ended.
    """

    path: Path
    data: dict[str, Any]

    @property
    def job_id(self) -> str:
        return str(self.data["job_id"])

    @classmethod
    def open(cls, state_dir: Path, job: JobRoot) -> Journal:
        """This job root's journal, made on first use; the caller holds the job root's lock.

        Raises:
            BadInputError: the state directory is inside the job root.
        """
        state_dir = state_dir.expanduser().resolve()
        if state_dir == job.root or job.root in state_dir.parents:
            raise BadInputError("--state-dir must lie outside the job root (the agent can write there)")
        jobs = state_dir / "jobs"
        jobs.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(state_dir, 0o700)
        root = str(job.root)
        job_id = _read_job_id(job.root)
        data = cls._load(jobs / f"{job_id}.json") if job_id else None
        if data is not None and data.get("root") != root:
            original = Path(str(data.get("root")))
            if original.exists():
                # A copy (cp -a keeps the id file), or an id file rewritten to claim another
                # job root's record: either way its own id and record, the other's untouched.
                log.warning("job_root_copy_detected", reason="its job id belongs to another job root")
                data = None
            else:
                data["root"] = root  # moved: the same job root under a new path, the old one gone
        if data is None:
            job_id = uuid.uuid4().hex[:16]
            data = {"job_id": job_id, "root": root, "markers": {}, "agent": None, "extract": None}
            (job.root / JOB_ID_FILE).write_text(job_id + "\n", encoding="ascii")
        journal = cls(path=jobs / f"{job_id}.json", data=data)
        journal.save()
        return journal

    @classmethod
    def find(cls, state_dir: Path, job: JobRoot) -> Journal | None:
        """This job root's journal if one exists (for ``--reduce``, which makes none)."""
        job_id = _read_job_id(job.root)
        path = state_dir.expanduser().resolve() / "jobs" / f"{job_id}.json"
        data = cls._load(path) if job_id else None
        return cls(path=path, data=data) if data is not None and data.get("root") == str(job.root) else None

    @staticmethod
    def _load(path: Path) -> dict[str, Any] | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and isinstance(data.get("markers"), dict) else None

    def save(self) -> None:
        write_bytes_atomic(self.path, render_json(self.data), mode=0o600)

    # --- markers ---------------------------------------------------------------------

    def marker(self, phase: Phase) -> Marker | None:
        raw = self.data["markers"].get(phase.value)
        if raw is None:
            return None
        try:
            return marker_type(phase).model_validate(raw)
        except ValidationError:
            return None

    def record(self, marker: Marker) -> None:
        self.data["markers"][marker.phase.value] = marker.model_dump(mode="json")
        if marker.phase is Phase.EXTRACT:
            self.data["extract"] = None
        self.save()

    def forget(self, *phases: Phase) -> None:
        for phase in phases:
            self.data["markers"].pop(phase.value, None)
        self.save()

    def untrusted_files(self, markers_dir: Path, phases: tuple[Phase, ...]) -> list[str]:
        """The marker files of ``phases`` that are not the journal's copies (nothing is changed)."""
        return [
            marker_path(markers_dir, phase).name
            for phase in phases
            if self._present(marker_path(markers_dir, phase)) != self._wanted(phase)
        ]

    def _wanted(self, phase: Phase) -> bytes | None:
        recorded = self.data["markers"].get(phase.value)
        return render_json(recorded) if recorded is not None else None

    @staticmethod
    def _present(path: Path) -> bytes | None:
        try:
            return path.read_bytes() if not path.is_symlink() else b"<link>"
        except FileNotFoundError:
            return None
        except OSError:
            return b"<unreadable>"

    def sync_files(self, markers_dir: Path, phases: tuple[Phase, ...]) -> list[str]:
        """Make the marker files of ``phases`` the journal's copies; the names of those that were not.

        A recorded marker whose file is gone is forgotten instead: that phase runs again.
        """
        replaced = []
        for phase in phases:
            path = marker_path(markers_dir, phase)
            wanted, present = self._wanted(phase), self._present(path)
            if present == wanted:
                continue
            if present is None:
                log.info("marker_deleted", phase=phase.value, action="the phase runs again")
                self.forget(phase)
                continue
            if present is not None:
                replaced.append(path.name)
            if path.is_dir() and not path.is_symlink():
                remove_tree(path)
            else:
                path.unlink(missing_ok=True)
            if wanted is not None:
                write_bytes_atomic(path, wanted)
        return replaced

    # --- the agent and the extraction: what was under way ----------------------------------

    def agent_starting(self, run_id: str) -> None:
        self.data["agent"] = {"state": "running", "run_id": run_id}
        self.save()

    def agent_contained(self, record: dict[str, Any]) -> None:
        """Its first process (pid, start time) and whether it heads a PID namespace of its own."""
        self.data["agent"].update(record)
        self.save()

    def agent_ended(self) -> None:
        self.data["agent"] = {"state": "ended"}
        self.save()

    def unwatched_agent(self) -> dict[str, Any] | None:
        """The record of an agent whose end no runner saw (its runner died), or None."""
        agent = self.data.get("agent")
        return agent if isinstance(agent, dict) and agent.get("state") == "running" else None

    def extract_placing(self, run_id: str) -> None:
        """Recorded just before the extracted tree is renamed into ``buggy-source/``."""
        self.data["extract"] = {"placing": run_id}
        self.save()

    def extraction_was_placing(self) -> bool:
        return isinstance(self.data.get("extract"), dict)


def evaluated(state_dir: Path, job: JobRoot) -> bool:
    """Does the runner's own record say this job root's patch was evaluated? (A ledger in the
    jobs directory is not proof: an agent of another task could have written it.)"""
    journal = Journal.find(state_dir, job)
    marker = journal.marker(Phase.EVALUATE) if journal is not None else None
    return marker is not None and marker.ok


# --- marker files: a marker is written atomically and only by the runner process ----------


def marker_path(markers_dir: Path, phase: Phase) -> Path:
    return markers_dir / marker_filename(phase)


def load_marker(markers_dir: Path, phase: Phase) -> Marker | None:
    path = marker_path(markers_dir, phase)
    if not path.exists():
        return None
    return read_marker(path, expected_phase=phase)


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat(timespec="milliseconds")


class PhaseClock:
    """Times one phase and turns its outcome into a marker."""

    def __init__(self, phase: Phase) -> None:
        self.phase = phase
        self.started = time.time()
        self._mono = time.monotonic()

    def marker(self, result: PhaseResult, *, ok: bool = True) -> Marker:
        """``result`` (the phase's own, or what its failure records) in a marker timed now."""
        return marker_type(self.phase)(
            phase=self.phase,
            status=MarkerStatus.OK if ok else MarkerStatus.FAILED,
            started_at=_utc(self.started),
            ended_at=_utc(time.time()),
            duration_seconds=round(time.monotonic() - self._mono, 3),
            exit_code=result.exit_code,
            reason=result.reason,
            details=result,
        )


def write_marker(markers_dir: Path, marker: Marker) -> Path:
    path = marker_path(markers_dir, marker.phase)
    write_json_atomic(path, marker.model_dump(mode="json"))
    return path
