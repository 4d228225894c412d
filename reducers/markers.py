"""Reading markers back, with errors that name the file and the field.

Pure: reads only the marker files it is given.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from reducers.models import Marker, Phase, marker_type
from reducers.errors import CompactInputError


def marker_filename(phase: Phase) -> str:
    return f"{phase.value}.json"


def _public_name(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def compact_input_error(document: str, error: ValidationError) -> CompactInputError:
    """The first problem of a pydantic validation, naming the document and the field."""
    first = error.errors()[0]
    return CompactInputError(document, ".".join(str(part) for part in first["loc"]), first["msg"])


def parse_marker(raw: object, name: str, *, expected_phase: Phase | None = None) -> Marker:
    """A marker's JSON document as its phase's typed marker.

    Raises:
        CompactInputError: a field is missing or wrong, or it records another phase
            than ``expected_phase``.
    """
    recorded = raw.get("phase") if isinstance(raw, dict) else None
    phase = next((p for p in Phase if p.value == recorded), None)
    if expected_phase is not None and phase is not None and phase is not expected_phase:
        raise CompactInputError(name, "phase", f"records {phase.value}, expected {expected_phase.value}")
    model = marker_type(phase) if phase is not None else Marker
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise compact_input_error(name, e) from e


def read_marker(path: Path, *, expected_phase: Phase | None = None) -> Marker:
    """Parse one marker file.

    Raises:
        CompactInputError: the file is not JSON, a field is missing or wrong,
            or it records another phase than its name says.
    """
    name = _public_name(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CompactInputError(name, "", f"not readable JSON ({type(e).__name__})") from e
    return parse_marker(raw, name, expected_phase=expected_phase)


def read_markers(markers_dir: Path) -> dict[Phase, Marker]:
    """Every phase marker present under ``markers_dir``, by phase."""
    found: dict[Phase, Marker] = {}
    for phase in Phase:
        path = markers_dir / marker_filename(phase)
        if path.exists():
            found[phase] = read_marker(path, expected_phase=phase)
    return found
