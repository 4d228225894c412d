"""Writing public files: every one passes the guard, then is written atomically.

Invariant: this is the only code that writes ``*.compact.json`` and
``real-result.public.json``; a guard failure writes nothing and raises.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reducers.guard import check_public, secret_values
from runner.atomic import write_json_atomic


def private_texts_for(job_root: Path) -> list[str]:
    """What must never appear in public output on this host: its paths and secret values."""
    texts = [str(job_root), str(Path.home())]
    texts.extend(secret_values(os.environ))
    return [text for text in texts if len(text) > 1]


def publish(path: Path, payload: Mapping[str, Any], *, private_texts: list[str]) -> None:
    check_public(path.name, payload, private_texts=private_texts)
    write_json_atomic(path, payload)
