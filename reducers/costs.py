"""What a suite's attempts cost: one summary for the batch's ledger and summary, the fleet's status
and the suite report, from the rows' ``cost_usd`` (``reducers.outcome.TaskFacts``).

Pure. A row whose cost is unknown (the rate card lacked its model, or it never ran codex) is
counted apart, never as 0 dollars.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from reducers.outcome import TaskFacts, TaskState

ROUNDING = 6  # a millionth of a dollar
# Rows whose cost is not (yet) the suite's: running or queued again (their end counts it), or never started.
UNSPENT_STATES = frozenset({TaskState.QUEUED, TaskState.RUNNING, TaskState.SKIPPED_BUDGET})


@dataclass(frozen=True)
class BudgetFigures:
    """A suite's budget as a view shows it: the limit, and what its running tasks have spent so far
    (which no finished row holds yet); a report after the suite has ended has ``running_usd`` 0."""

    limit_usd: float
    running_usd: float = 0.0


class Priced(Protocol):
    """What a summary needs of a row: a ledger's (``TaskFacts``) or a view's (``TaskRow``)."""

    state: TaskState
    resolved: bool | None
    cost_usd: float | None

    @property
    def spent_tokens(self) -> bool: ...


def cost_summary(
    rows: Iterable[tuple[str, Priced]], *, budget_usd: float | None = None, running_usd: float = 0.0
) -> dict[str, Any]:
    """Total, per tag, per resolved task; with a budget, what is spent (``running_usd``: the running
    tasks' live usage so far, which no row holds yet) and what is left of it."""
    total = 0.0
    per_tag: dict[str, float] = {}
    priced = unpriced = resolved = skipped = 0
    for tag, facts in rows:
        if facts.state is TaskState.SKIPPED_BUDGET:
            skipped += 1
            continue
        resolved += bool(facts.resolved)
        if facts.cost_usd is None:
            unpriced += facts.spent_tokens  # it spent, at a price unknown
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
        spent = total + running_usd
        summary |= {"budget_usd": budget_usd, "spent_usd": round(spent, ROUNDING),
                    "left_usd": round(max(budget_usd - spent, 0.0), ROUNDING), "skipped_budget": skipped}
    return summary


def estimate_cost(
    history: Iterable[tuple[str, TaskFacts]], tags: list[str], *, model: str | None = None, attempts: int = 1
) -> dict[str, Any]:
    """What ``tags`` (``attempts`` each; a tag named twice counts twice) should cost, from the priced
    finished rows of ``history``: the plan mode's and ``submit --dry-run``'s one estimate.

    Of the same model when one is named (else of any); a tag with history of its own is
    estimated from it, the others from the mean over every tag. The range is the cheapest and
    dearest attempt seen, per tag where known.
    """
    per_tag: dict[str, list[float]] = {}
    tokens: list[int] = []
    for tag, facts in history:
        if facts.cost_usd is None or facts.state in UNSPENT_STATES or (model is not None and facts.model != model):
            continue
        per_tag.setdefault(tag, []).append(facts.cost_usd)
        tokens.append(facts.input_tokens + facts.output_tokens)
    every = [cost for costs in per_tag.values() for cost in costs]
    base: dict[str, Any] = {"model": model, "tags": len(set(tags)), "attempts_per_tag": attempts,
                            "units": len(tags) * attempts, "attempts_in_history": len(every)}
    if not every:
        return base | {"known": False, "expected_usd": None, "low_usd": None, "high_usd": None,
                       "why": "no priced attempt in the ledger's history" + (f" of model {model}" if model else "")}
    mean_all = sum(every) / len(every)
    expected = low = high = 0.0
    for tag in tags:
        own = per_tag.get(tag)
        costs = own or every
        expected += attempts * (sum(costs) / len(costs) if own else mean_all)
        low += attempts * min(costs)
        high += attempts * max(costs)
    return base | {
        "known": True,
        "expected_usd": round(expected, ROUNDING),
        "low_usd": round(low, ROUNDING),
        "high_usd": round(high, ROUNDING),
        "mean_per_attempt_usd": round(mean_all, ROUNDING),
        "mean_tokens_per_attempt": round(sum(tokens) / len(tokens)),
        "tags_with_own_history": sum(1 for tag in set(tags) if tag in per_tag),
    }

