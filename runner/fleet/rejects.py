"""A message that cannot become a task, as a failed row where the operator will look for it.

Only values that pass the same checks as a real task's are taken from the message
(its suite, tag and attempt); anything else is replaced, never echoed.
"""

from __future__ import annotations

from typing import Any

from reducers.outcome import TaskState
from runner.fleet.ledger import LedgerRow, now
from runner.settings import is_safe_tag
from runner.tags import MAX_ATTEMPTS
from runner.tasks.protocol import SAFE_SUITE, MessageError, safe_patch_name

REJECTED_SUITE = "_rejected"  # where a message whose suite name is unsafe gets its failed row


def rejected_row(payload: Any, error: MessageError, *, queue: str, host: str, message_id: str) -> tuple[str, LedgerRow]:
    """(suite, row) of a refused message: a failed ``bad_message`` row, never retried."""
    fields = payload if isinstance(payload, dict) else {}
    suite = fields.get("suite")
    suite = suite if isinstance(suite, str) and SAFE_SUITE.fullmatch(suite) and ".." not in suite else REJECTED_SUITE
    spec = fields.get("spec")
    tag = spec.get("tag") if isinstance(spec, dict) else None
    attempt = fields.get("attempt")
    attempt = attempt if isinstance(attempt, int) and not isinstance(attempt, bool) and 1 <= attempt <= MAX_ATTEMPTS else 1
    if not (isinstance(tag, str) and is_safe_tag(tag)) or suite == REJECTED_SUITE:
        tag = f"invalid-{message_id.replace('-', '')[-12:]}"
    identity: dict[str, Any] = {}
    if fields.get("kind") == "eval":  # an evaluation unit's: on its own key when its names are safe
        unit = fields.get("unit")
        name = unit.get("name") if isinstance(unit, dict) else None
        identity = {"kind": "eval", "patch": name if safe_patch_name(name) and not tag.startswith("invalid-")
                    else f"invalid-{message_id.replace('-', '')[-12:]}"}
    row = LedgerRow(tag=tag, attempt=attempt, **identity, state=TaskState.FAILED, queue=queue, host=host,
                    failure_label="bad_message", error=str(error)[:500], submitted_at=now(), finished_at=now())
    return suite, row
