"""What reducers/ raises, under its own root: reducers are pure and import nothing of runner/.

Invariant (as for the runner's errors): ``str(error)`` is public-safe. Each carries a
short ``reason`` code; the runner maps each kind to its exit code
(``runner.errors.exit_code_of``).
"""

from __future__ import annotations


class ReducerError(Exception):
    """Root of the reducers' errors; ``reason`` is a short public code."""

    reason: str = "reducer_error"


class PublicSafetyError(ReducerError):
    """A public file would carry something private; nothing is written."""

    reason = "public_safety_violation"

    def __init__(self, document: str, key_path: str, rule: str) -> None:
        self.document = document
        self.key_path = key_path
        self.rule = rule
        super().__init__(f"{document}: {key_path or '<root>'} refused by the public guard ({rule})")


class CompactInputError(ReducerError):
    """A marker or compact file cannot be read back; names the file and the field."""

    reason = "bad_compact_input"

    def __init__(self, file: str, field: str, problem: str) -> None:
        self.file = file
        self.field = field
        super().__init__(f"{file}: {field or '<root>'}: {problem}")
