"""Tags and attempts as operators give them (a tags file, repeated --tag, --attempts); shared by the
batch, the audit and submit."""

from __future__ import annotations

from pathlib import Path

from runner.errors import BadInputError
from runner.settings import is_safe_tag

# Attempts per tag, at most: a batch, --execute and submit alike.
MAX_ATTEMPTS = 100


def check_attempts(attempts: int) -> int:
    if not 1 <= attempts <= MAX_ATTEMPTS:
        raise BadInputError(f"--attempts must be between 1 and {MAX_ATTEMPTS}")
    return attempts


def check_tag(tag: str, where: str) -> str:
    """A tag as the settings take it (and so its default image reference), named where it came from."""
    if not is_safe_tag(tag):
        raise BadInputError(f"{where}: {tag[:40]!r} is not a safe tag")
    return tag


def read_tags_file(path: Path) -> list[str]:
    """One tag a line; ``#`` starts a comment; blank lines are skipped.

    Raises:
        BadInputError: unreadable file, or a line that is not a safe tag (naming the line).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BadInputError(f"--tags-file cannot be read ({type(e).__name__})") from e
    tags: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        tag = line.split("#", 1)[0].strip()
        if not tag:
            continue
        tags.append(check_tag(tag, f"--tags-file line {number}"))
    return tags


def unique_tags(tags: list[str]) -> list[str]:
    if not tags:
        raise BadInputError("the batch has no tags: give --tags-file FILE or --tag T (repeatable)")
    return list(dict.fromkeys(tags))
