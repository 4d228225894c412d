"""What a suite's attempts cost: one summary for the batch's ledger and summary, the fleet's status
and the suite report, from the rows' ``cost_usd`` (``reducers.outcome.TaskFacts``).

Pure. A row whose cost is unknown (the rate card lacked its model, or it never ran codex) is
counted apart, never as 0 dollars.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from reducers.outcome import TaskFacts, TaskState

ROUNDING = 6  # a millionth of a dollar


def cost_summary(rows: Iterable[tuple[str, TaskFacts]], *, budget_usd: float | None = None) -> dict[str, Any]:
    """Total, per tag, per resolved task; with a budget, what is left of it."""
    total = 0.0
    per_tag: dict[str, float] = {}
    priced = unpriced = resolved = skipped = 0
    for tag, facts in rows:
        if facts.state is TaskState.SKIPPED_BUDGET:
            skipped += 1
            continue
        resolved += bool(facts.resolved)
        if facts.cost_usd is None:
            unpriced += facts.model is not None or facts.input_tokens > 0  # it spent, at a price unknown
            continue
        priced += 1
        total += facts.cost_usd
        per_tag[tag] = per_tag.get(tag, 0.0) + facts.cost_usd
    summary: dict[str, Any] = {
        "total_usd": round(total, ROUNDING),
        "tasks_priced": priced,
        "tasks_cost_unknown": unpriced,
        "per_task_usd": round(total / priced, ROUNDING) if priced else None,
        "per_resolved_usd": round(total / resolved, ROUNDING) if resolved else None,
        "per_tag_usd": {tag: round(cost, ROUNDING) for tag, cost in sorted(per_tag.items())},
    }
    if budget_usd is not None:
        summary |= {"budget_usd": budget_usd, "left_usd": round(max(budget_usd - total, 0.0), ROUNDING),
                    "skipped_budget": skipped}
    return summary
