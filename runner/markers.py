"""Phase markers: one small JSON file per phase under ``result-markers/``.

Invariant: a marker is written atomically and only by the runner process; a
phase with an ``ok`` marker is done and is skipped when the job root is run again.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

from reducers.markers import marker_filename, read_marker
from reducers.models import Marker, MarkerStatus, Phase, PhaseResult, marker_type
from runner.atomic import write_json_atomic


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
