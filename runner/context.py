"""What every phase is handed: settings, the job root, the run id, one Docker client.

What a phase returns is its typed result in ``reducers.models`` (``PhaseResult``).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import docker

from reducers.models import Phase
from runner.docker_utils import connect, runner_labels
from runner.jobroot import JobRoot
from runner.journal import Journal
from runner.settings import RunnerSettings


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def sha256_file(path: Path) -> str:
    """Streamed, so a multi-GB log costs one buffer of memory."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class JobContext:
    settings: RunnerSettings
    job: JobRoot
    run_id: str = field(default_factory=new_run_id)
    job_id: str = "unassigned"  # set by the pipeline once it holds the job root's lock
    journal: Journal | None = None  # the runner's own record, opened with the lock
    _client: docker.DockerClient | None = field(default=None, repr=False)

    def docker(self) -> docker.DockerClient:
        if self._client is None:
            self._client = connect()
        return self._client

    def labels(self, phase: Phase) -> dict[str, str]:
        return runner_labels(job_id=self.job_id, run_id=self.run_id, phase=phase.value)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
