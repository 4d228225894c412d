"""Every view is rendered from a document that passed the public guard.

Invariant: the page, /healthz, /metrics labels and the report show only strings
that ``reducers.guard.check_public`` accepts; a string it refuses (a check's
detail naming a path, say) is shown as ``WITHHELD``, never dropped silently and
never shown as is.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from reducers.guard import check_public, secret_values
from runner.errors import PublicSafetyError

WITHHELD = "[withheld: not public-safe]"


def view_private_texts(extra: Iterable[str] = ()) -> list[str]:
    """This host's home directory and secret values, plus the caller's own (a jobs dir, say)."""
    texts = [str(Path.home()), *secret_values(os.environ), *extra]
    return [text for text in texts if len(text) > 1]


def _safe_string(text: str, private_texts: list[str]) -> str:
    try:
        check_public("view", {"value": text}, private_texts=private_texts)
    except PublicSafetyError:
        return WITHHELD
    return text


def _scrub(value: Any, private_texts: list[str]) -> Any:
    if isinstance(value, str):
        return _safe_string(value, private_texts)
    if isinstance(value, Mapping):
        return {key: _scrub(child, private_texts) for key, child in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrub(child, private_texts) for child in value]
    return value


def public_document(name: str, document: Mapping[str, Any], private_texts: list[str]) -> dict[str, Any]:
    """``document`` with every refused string withheld, then checked whole by the guard.

    Raises:
        PublicSafetyError: a key (not a value) is refused; keys come from the views' own
            closed sets, so this is a bug in the view, not in the data.
    """
    scrubbed = _scrub(document, private_texts)
    check_public(name, scrubbed, private_texts=private_texts)
    return scrubbed
