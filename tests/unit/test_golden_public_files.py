"""The three public files, byte for byte, from the markers of three real runs.

``tests/golden/<case>/`` holds what a real run on the stub image wrote (the fake codex
fixing, fixing wrongly, failing): its ``result-markers/`` and its three public files.
Reducing those markers again must give the very same bytes, whatever the markers'
schema becomes in the code: the public files are what every consumer reads.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runner.jobroot import BENCHMARK_RESULT, BENCHMARK_RUN, REAL_RESULT, JobRoot
from runner.journal import load_marker, write_marker
from runner.phases.reduce import reduce_job
from reducers.models import Phase

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
PUBLIC = (BENCHMARK_RUN, BENCHMARK_RESULT, REAL_RESULT)


@pytest.mark.parametrize(
    ("case", "terminal_state"),
    [("resolved", "resolved"), ("unresolved", "evaluated_unresolved"), ("failed", "runner_failed")],
)
def test_public_files_are_byte_identical(tmp_path: Path, case: str, terminal_state: str) -> None:
    job = JobRoot.at(tmp_path / "job", "stub_calc")
    shutil.copytree(GOLDEN / case / "result-markers", job.markers)
    reduced = reduce_job(job)
    assert reduced.terminal_state == terminal_state
    for name in PUBLIC:
        assert job.public(name).read_bytes() == (GOLDEN / case / name).read_bytes(), f"{case}: {name} changed"


@pytest.mark.parametrize("case", ["resolved", "unresolved", "failed"])
def test_markers_survive_a_round_trip(tmp_path: Path, case: str) -> None:
    """A marker read and written again reduces to the same public bytes (what a resume does)."""
    source = GOLDEN / case / "result-markers"
    job = JobRoot.at(tmp_path / "job", "stub_calc")
    job.markers.mkdir(parents=True)
    for phase in Phase:
        marker = load_marker(source, phase)
        if marker is not None:
            write_marker(job.markers, marker)
    reduce_job(job)
    for name in PUBLIC:
        assert job.public(name).read_bytes() == (GOLDEN / case / name).read_bytes(), f"{case}: {name} changed"
